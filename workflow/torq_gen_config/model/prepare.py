"""Model preparation: load and check the user's ONNX model, fix symbolic dimensions,
upgrade the opset, infer shapes, and keep track of which prepared node comes from
which node of the user's model.

Layer IDs and node indices always refer to the user's model (docs/original_tool.md,
'Layer IDs and indices'). The opset upgrade (``onnx.version_converter``) renames
tensors and can expand one node into several (Softmax-9 becomes
Shape/Flatten/Softmax/Reshape at opset 13+), so every user node is tagged with a
unique name before the conversion and the tags are read back afterwards
(docs/toolchain.md, 'Opset 17 legalization').
"""

from __future__ import annotations

import mmap
import os
import tempfile
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from ..core.errors import ModelError
from ..core.lazy import onnx, protobuf_message, version_converter
from .graph import user_node_table
from .opset_upgrade import (
    _TAG, _restore_node_names, _restore_tensor_names, model_signature, signature_changes, trace_node_origins,
)
from .shapes import apply_observed_types, complete_static_shapes, unknown_runtime_tensors
from .subgraph import CONFIG_KEYS, extract_subgraph, resolve_range
from .symbolic_dims import fix_symbolic_dims
from ..core.limits import NOTE_CHARS
from ..core.external_data import (
    external_data_problem, load_weights, model_bytes, model_tensors, resolve_locations,
)
from ..core.weight_store import MIN_EXTERNAL_BYTES, externalize
from .onnx_file import WireError, read_skeleton


def check_model_file(path: str | os.PathLike) -> None:
    """The checks of a model path that need no reading: not a ``.tflite`` model (the tool
    is ONNX-only, as the original), a file that exists, is not a directory, not empty.

    Raises:
        ModelError: one line naming the path and the problem.
    """
    p = Path(path)
    if p.suffix.lower() == ".tflite":
        raise ModelError(f"{p}: TFLite models are not supported; torq-gen-config is ONNX-only (convert the model to ONNX first)")
    if not p.exists():
        raise ModelError(f"model file not found: {p}")
    if p.is_dir():
        raise ModelError(f"model path is a directory, not an ONNX file: {p}")
    if p.stat().st_size == 0:
        raise ModelError(f"{p}: file is empty, not an ONNX model")


def load_model(path: str | os.PathLike, store: str | os.PathLike | None = None, *,
               graph_only: bool = False) -> "onnx.ModelProto":  # noqa: F821
    """Load an ONNX model file and check that it really is one.

    The file is read as a skeleton (:func:`~.onnx_file.read_skeleton`): the values of
    its large tensors stay in the file (or in its external data files) until they are
    needed, so that no step holds the weights twice (``onnx.load`` holds them twice
    while it parses).

    Args:
        path: ``.onnx`` file (external data next to it is read too).
        store: copy every large tensor into this weight store file, file to file
            (:func:`~torq_gen_config.core.weight_store.externalize`), and check the graph
            beside it; the returned model's stored tensors refer to the store (absolute
            locations).
        graph_only: no store, no weights read and no ONNX checker (the preparation runs
            it): the early checks of the command line; large tensors refer to the file.
        Neither: the weights are read in and the whole model is checked.

    Returns:
        The loaded ``onnx.ModelProto``.

    Raises:
        ModelError: the file is missing, a directory, a ``.tflite`` model (rejected:
            the tool is ONNX-only, as the original), not a protobuf, truncated,
            has no graph, its external data is missing or short, or the checker
            rejects it.
    """
    p = Path(path)
    check_model_file(p)
    try:
        model = onnx.load_from_string(read_skeleton(p, min_bytes=MIN_EXTERNAL_BYTES)[0])
    except (WireError, protobuf_message.DecodeError, RuntimeError, ValueError, UnicodeDecodeError) as e:
        raise ModelError(f"{p}: not a valid ONNX model (cannot parse the protobuf: {_one_line(e)})") from None
    except OSError as e:
        raise ModelError(f"{p}: cannot read model: {_one_line(e)}") from None
    missing = sorted({e.value for t in model_tensors(model) for e in t.external_data if e.key == "location"
                      and not os.path.isabs(e.value) and not (p.parent / e.value).is_file()})
    if missing:
        raise ModelError(f"{p}: the model's external data file{'s' if len(missing) > 1 else ''} "
                         f"{', '.join(str(p.parent / m) for m in missing)} not found (keep the data files next to "
                         "the .onnx file)")
    resolve_locations(model, p.parent)
    short = external_data_problem(model)
    if short:
        raise ModelError(f"{p}: cannot read the model's external data: {short}")
    if not model.opset_import or not model.HasField("graph"):
        raise ModelError(f"{p}: not a valid ONNX model (no graph or opset; is the file truncated or of another "
                         "format?)")
    if len(model.graph.node) == 0:
        raise ModelError(f"{p}: the model has no nodes (its graph only passes inputs to outputs): there is no "
                         "layer to test")
    if graph_only:
        return model
    try:
        if store is None:
            load_weights(model)
            onnx.checker.check_model(model)
        else:
            externalize(model, store)
            resolve_locations(model, Path(store).parent)
            _check_beside(model, store)
    except onnx.checker.ValidationError as e:
        raise ModelError(f"{p}: ONNX checker rejected the model: {_one_line(e)}") from None
    return model


def _check_beside(model, store: str | os.PathLike | None) -> None:
    """The ONNX checker on ``model``; with a weight store, on its graph written beside the
    store (the checker copies what it is given, and refuses absolute locations).

    Raises:
        onnx.checker.ValidationError: the model fails the checker.
    """
    if store is None:
        onnx.checker.check_model(model)
        return
    fd, skeleton = tempfile.mkstemp(dir=Path(store).parent, prefix=".check-", suffix=".onnx")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(model_bytes(model, skeleton))
        onnx.checker.check_model(skeleton)
    finally:
        os.unlink(skeleton)


_LOCATION_ENTRY = b"\x0a\x08location"
"""How a tensor's ``external_data`` entry ``key: "location"`` is serialized (field 1 of
``StringStringEntryProto``, length 8): a model file without these bytes names no
external data file."""


def _may_name_external_data(path: Path) -> bool:
    """False when the model file cannot name an external data file (no
    :data:`_LOCATION_ENTRY` in it): spares the onnx import and the parse (about 0.6 s)
    at every Snakemake start, where :func:`model_fingerprint` runs."""
    try:
        with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
            return m.find(_LOCATION_ENTRY) != -1
    except (OSError, ValueError):  # unreadable, empty: the preparation job says what is wrong
        return False


def model_fingerprint(path: str | os.PathLike, *, parse_limit_bytes: int = 64 << 20) -> dict:
    """Identity of a model file and its external-data files (path, size, mtime in ns).

    Used as a parameter of the preparation job so that pointing the workflow at
    another file (even an older one, which an mtime comparison misses) or changing
    the external weights next to the model reruns the preparation. External data
    locations are read from the model without loading the weights, for ``.onnx``
    files up to ``parse_limit_bytes`` (models with external data are small).
    """
    p = Path(path).resolve()
    try:
        st = p.stat()
    except OSError:
        return {"path": str(p), "size": None, "mtime_ns": None, "external_data": []}
    fp = {"path": str(p), "size": st.st_size, "mtime_ns": st.st_mtime_ns, "external_data": []}
    if st.st_size <= parse_limit_bytes and _may_name_external_data(p):
        try:
            model = onnx.load(str(p), load_external_data=False)
            locations = sorted({e.value for t in model_tensors(model) for e in t.external_data if e.key == "location"})
        except Exception:  # an unreadable model is reported by the preparation job itself
            locations = []
        for loc in locations:
            q = p.parent / loc
            try:
                sq = q.stat()
                fp["external_data"].append([loc, sq.st_size, sq.st_mtime_ns])
            except OSError:
                fp["external_data"].append([loc, None, None])
    return fp


def default_opset(model: "onnx.ModelProto") -> int:  # noqa: F821
    """Version of the default ("" / "ai.onnx") domain in ``model.opset_import``."""
    for op in model.opset_import:
        if op.domain in ("", "ai.onnx"):
            return op.version
    return 0


def prepare_model(src: str | os.PathLike, *, target_opset: int = 17,
                  subgraph: tuple[str, str] | None = None,
                  conversions: Sequence[tuple[str, Callable]] = (),
                  input_shapes: Mapping[str, list[int]] | None = None,
                  shape_sources: Mapping[str, str] | None = None,
                  observe: Callable[..., dict] | None = None,
                  store: str | os.PathLike | None = None) -> tuple["onnx.ModelProto", dict]:  # noqa: F821
    """Prepare the user's model for layer split and import.

    Steps: load and check; drop initializers from the graph inputs (IR < 4 style);
    give every dynamic input dim a value (``input_shapes``, else the rule of
    :mod:`torq_gen_config.model.symbolic_dims`: metadata, the model's stride, 1); upgrade the
    default-domain opset to ``target_opset`` when lower (IREE's importer legalizes
    several ops only from opset 17, docs/toolchain.md), unless the upgrade
    would change the model's signature: then the model keeps its opset, with a warning
    (``info["opset"]["upgrade_undone"]``); restore the user's node and tensor names;
    complete every tensor's shape and dtype (static inference, then folded constants
    fed back into inference, :func:`torq_gen_config.model.shapes.complete_static_shapes`,
    then the types ``observe`` reports from a whole-model run); with ``subgraph``,
    cut out that range of the user's nodes (:mod:`torq_gen_config.model.subgraph`).

    Args:
        subgraph: ``(from, to)`` names (layer ID or output name) of the first and
            last user node of a subgraph (subgraph mode), or None for the whole model.
        input_shapes: graph input name -> shape (``--input-shapes``, or the shapes of
            the ``--input-data`` arrays): the values of its symbolic dims;
            ``shape_sources`` says which (see :func:`fix_symbolic_dims`).
        observe: ``observe(model, want=[names], unknown=[names])`` is called once with
            the upgraded, statically completed (whole, uncut) model; it runs the model
            (:mod:`torq_gen_config.reference.model_run`) and returns ``{"types": {name: observed
            type}, "info": {...}}``; ``want`` are the subgraph's inputs in subgraph mode
            (the caller keeps their values: the subgraph's realistic inputs). The
            observed types fill in what static inference left unknown and replace
            declared types the run contradicts (a warning each); ``info`` goes to
            ``info["model_run"]``.
        conversions: ``(key, convert)`` pairs applied in order to the (cut) model, e.g.
            ``("bf16", precision.narrowing.convert_to_bf16)`` for
            ``--auto-convert-bf16`` (docs/original_tool.md, 'Dtype conversion'; the
            caller raises ``target_opset`` to what they need). ``convert(model)`` returns
            ``(model, report)`` with ``report["origin"]`` (per new node, the index of the
            node it comes from); the reports go to ``info["precision"][key]``. Nodes a
            conversion inserts (Casts) belong to the user node they serve. Passed in by
            the caller, so that model preparation does not depend on the precision modes.
        store: the weight store file (:mod:`torq_gen_config.core.weight_store`): right after
            loading, every large tensor moves there and the steps after it work on the
            graph alone (memory: the weights once, while loading); the returned model's
            stored tensors have absolute locations (the caller saves it with
            :func:`~torq_gen_config.core.weight_store.externalize` again, which keeps an
            unchanged store as it is). None: the weights stay in memory.

    Returns:
        ``(prepared_model, info)``; ``info`` is JSON-safe and holds
        ``user_nodes`` (see :func:`user_node_table`; in subgraph mode only the
        nodes the subgraph holds, with their indices in the user's model),
        ``prepared_nodes`` (per prepared node: ``op_type``, ``graph_index`` of the
        user node it comes from), ``fixed_dims``, ``fixed_shapes`` (the full shape of
        each input with a fixed dim), ``opset`` (original, prepared),
        ``warnings``, and in subgraph mode ``subgraph`` (the resolved ends, the
        subgraph's inputs and outputs, the constant nodes taken from outside the range).

    Raises:
        ModelError: see :func:`load_model`; an int64 constant out of int32 range
            (the int32 conversion), or a converted model that fails the checker.
        ConfigError: an unknown subgraph name or a reversed range; an
            ``input_shapes`` entry that names no input or contradicts a static dim.
    """
    model = load_model(src, store)
    info: dict[str, Any] = {"source": str(src), "warnings": [], "fixed_dims": []}
    info["user_nodes"] = user_node_table(model)
    orig_opset = default_opset(model)
    info["opset"] = {"original": orig_opset, "prepared": orig_opset}

    init_names = {t.name for t in model.graph.initializer}
    keep_inputs = [i for i in model.graph.input if i.name not in init_names]
    del model.graph.input[:]
    model.graph.input.extend(keep_inputs)
    if model.ir_version < 4:
        model.ir_version = 4

    info["fixed_dims"] = fix_symbolic_dims(model, input_shapes, shape_sources)
    fixed_inputs = {d["input"] for d in info["fixed_dims"]}
    info["fixed_shapes"] = {i.name: [d.dim_value for d in i.type.tensor_type.shape.dim]
                            for i in model.graph.input if i.name in fixed_inputs}

    original_names = [n.name for n in model.graph.node]
    for i, n in enumerate(model.graph.node):
        n.name = f"{_TAG}{i}"

    if orig_opset and orig_opset < target_opset:
        before = model_signature(model)
        try:
            upgraded = version_converter.convert_version(model, target_opset)
        except Exception as e:  # the converter raises bare RuntimeError/ValidationError
            info["warnings"].append(
                f"opset upgrade {orig_opset} -> {target_opset} failed ({_one_line(e)}); "
                f"the model is imported at opset {orig_opset} and some ops may fail to compile")
        else:
            changes = signature_changes(before, model_signature(upgraded))
            if changes:  # undone: the layers must be the ones the user's model has
                info["opset"]["upgrade_undone"] = "; ".join(changes)
                info["warnings"].append(
                    f"the opset upgrade {orig_opset} -> {target_opset} would change the model's signature "
                    f"({'; '.join(changes[:4])}{'; ...' if len(changes) > 4 else ''}), so it was not applied: the "
                    f"model is kept at opset {orig_opset} (IREE's ONNX importer legalizes several ops only from opset "
                    f"17, so some layers may fail to compile; re-export the model at opset >= {target_opset} to "
                    "avoid this)")
            else:
                model = upgraded
                info["opset"]["prepared"] = target_opset

    if info["opset"]["prepared"] and info["opset"]["prepared"] < 17 and not info["opset"].get("upgrade_undone"):
        info["warnings"].append(f"the model stays at opset {info['opset']['prepared']} (target_opset "
                                f"{target_opset}): IREE's ONNX importer legalizes several ops only from opset 17, "
                                "so some layers may fail to compile")
    origin = trace_node_origins(model, len(original_names), info["user_nodes"])
    _restore_tensor_names(model, info["user_nodes"], origin)
    _restore_node_names(model, original_names, origin, info["user_nodes"])

    min_ir = onnx.helper.find_min_ir_version_for(list(model.opset_import), ignore_unknown=True)
    if model.ir_version < min_ir:
        model.ir_version = min_ir
    model, static = complete_static_shapes(model, info["warnings"])
    try:
        _check_beside(model, store)
    except Exception as e:
        unknown = (f" ({len(static['unknown'])} tensor(s) have no known shape yet: the whole-model run below fills "
                   "in what it computes)") if static["unknown"] else ""
        info["warnings"].append(f"prepared model does not pass the ONNX checker{unknown}: {_one_line(e)}")
    info["shapes"] = {"inferred_after_folding": static["learnt_from_folding"], "observed": [], "conflicts": [],
                      "unknown": static["unknown"]}
    if observe is not None:
        want = _subgraph_inputs(model, origin, info, subgraph) if subgraph is not None else []
        run = observe(model, want=want, unknown=list(static["unknown"]))
        info["model_run"] = run.get("info")
        applied = apply_observed_types(model, run.get("types") or {})
        info["shapes"]["observed"] = applied["observed"]
        info["shapes"]["conflicts"] = applied["conflicts"]
        for line in applied["conflicts"]:
            info["warnings"].append(f"the model's declared type is wrong for {line} (the run's type is used)")
    if subgraph is not None:
        model, origin = _cut_subgraph(model, origin, info, subgraph)
    info["shapes"]["unknown"] = unknown_runtime_tensors(model)
    if conversions:
        load_weights(model)  # the conversions rewrite weights: their values are needed here
        info["precision"] = {}
        for key, convert in conversions:
            model, report = convert(model)
            origin = [origin[k] for k in report.pop("origin")]
            info["precision"][key] = report

    info["prepared_nodes"] = [
        {"op_type": n.op_type, "domain": n.domain, "graph_index": origin[j]}
        for j, n in enumerate(model.graph.node)
    ]
    return model, info


def _subgraph_inputs(model, origin: list[int], info: dict, subgraph: tuple[str, str]) -> list[str]:
    """The run-time tensors the subgraph reads from the rest of the model (its inputs)."""
    rng = resolve_range(info["user_nodes"], subgraph[0], subgraph[1], labels=CONFIG_KEYS)
    return list(extract_subgraph(model, origin, rng["from"]["graph_index"], rng["to"]["graph_index"])[2]["inputs"])


def _cut_subgraph(model, origin: list[int], info: dict, subgraph: tuple[str, str]):
    """Subgraph mode: replace the prepared model by the subgraph; keep the user's
    indices (``info["user_nodes"]`` keeps the entries of the nodes it holds)."""
    rng = resolve_range(info["user_nodes"], subgraph[0], subgraph[1], labels=CONFIG_KEYS)
    sub, sub_origin, sub_info = extract_subgraph(model, origin, rng["from"]["graph_index"], rng["to"]["graph_index"])
    held = set(sub_origin)
    sub_info["outside_constant_nodes"] = [
        {k: info["user_nodes"][gi][k] for k in ("graph_index", "node_index", "op_type", "outputs")}
        for gi in sub_info["outside_constant_nodes"]]
    info["user_nodes"] = [u for u in info["user_nodes"] if u["graph_index"] in held]
    info["subgraph"] = {"from": rng["from"], "to": rng["to"], "suffix": rng["suffix"], **sub_info}
    try:
        onnx.checker.check_model(sub)
    except Exception as e:
        info["warnings"].append(f"the subgraph does not pass the ONNX checker: {_one_line(e)}")
    return sub, sub_origin


def _one_line(e: BaseException) -> str:
    """First non-empty line of an exception message, at most 300 characters."""
    text = str(e).strip() or type(e).__name__
    line = next((ln.strip() for ln in text.splitlines() if ln.strip()), text)
    return line[:NOTE_CHARS]
