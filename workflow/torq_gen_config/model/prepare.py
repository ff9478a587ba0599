"""Model preparation: load and check the user's ONNX model, fix symbolic dimensions,
upgrade the opset, infer shapes, and keep track of which prepared node comes from
which node of the user's model.

Layer IDs and node indices always refer to the user's model (seed 001 section 6,
"Position-Based Matching"). The opset upgrade (``onnx.version_converter``) renames
tensors and can expand one node into several (Softmax-9 becomes
Shape/Flatten/Softmax/Reshape at opset 13+), so every user node is tagged with a
unique name before the conversion and the tags are read back afterwards
(notes/toolchain.md section 2-3).
"""

from __future__ import annotations

import os
from collections import defaultdict
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from ..config import parse_input_shapes  # noqa: F401 (re-exported: its old home)
from ..errors import ConfigError, ModelError
from .graph import user_node_table  # noqa: F401 (re-exported: its old home)
from .shapes import apply_observed_types, complete_static_shapes, unknown_runtime_tensors

#: Prefix of the temporary node names used to trace nodes through the opset upgrade.
_TAG = "__tgc_node_"


def load_model(path: str | os.PathLike) -> "onnx.ModelProto":  # noqa: F821
    """Load an ONNX model file and check that it really is one.

    Args:
        path: ``.onnx`` file (external data next to it is loaded too).

    Returns:
        The loaded ``onnx.ModelProto``.

    Raises:
        ModelError: the file is missing, a directory, a ``.tflite`` model (rejected:
            the tool is ONNX-only, seed 002 section 11), not a protobuf, truncated,
            or has no graph.
    """
    import onnx
    from google.protobuf.message import DecodeError

    p = Path(path)
    if p.suffix.lower() == ".tflite":
        raise ModelError(f"{p}: TFLite models are not supported; torq-gen-config is ONNX-only (convert the model to ONNX first)")
    if not p.exists():
        raise ModelError(f"model file not found: {p}")
    if p.is_dir():
        raise ModelError(f"model path is a directory, not an ONNX file: {p}")
    if p.stat().st_size == 0:
        raise ModelError(f"{p}: file is empty, not an ONNX model")
    try:
        model = onnx.load(str(p), load_external_data=False)
    except (DecodeError, RuntimeError, ValueError, UnicodeDecodeError) as e:
        raise ModelError(f"{p}: not a valid ONNX model (cannot parse the protobuf: {_one_line(e)})") from None
    except OSError as e:
        raise ModelError(f"{p}: cannot read model: {_one_line(e)}") from None
    missing = sorted({e.value for t in _all_tensors(model) for e in t.external_data if e.key == "location"
                      and not (p.parent / e.value).is_file()})
    if missing:
        raise ModelError(f"{p}: the model's external data file{'s' if len(missing) > 1 else ''} "
                         f"{', '.join(str(p.parent / m) for m in missing)} not found (keep the data files next to "
                         "the .onnx file)")
    try:
        from onnx.external_data_helper import load_external_data_for_model

        load_external_data_for_model(model, str(p.parent))
    except Exception as e:  # a data file that is too short or unreadable
        raise ModelError(f"{p}: cannot read the model's external data: {_one_line(e)}") from None
    if not model.opset_import or not model.HasField("graph"):
        raise ModelError(f"{p}: not a valid ONNX model (no graph or opset; is the file truncated or of another "
                         "format?)")
    if len(model.graph.node) == 0:
        raise ModelError(f"{p}: the model has no nodes (its graph only passes inputs to outputs): there is no "
                         "layer to test")
    try:
        onnx.checker.check_model(model)
    except onnx.checker.ValidationError as e:
        raise ModelError(f"{p}: ONNX checker rejected the model: {_one_line(e)}") from None
    return model


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
    if st.st_size <= parse_limit_bytes:
        try:
            import onnx

            model = onnx.load(str(p), load_external_data=False)
            locations = sorted({e.value for t in _all_tensors(model) for e in t.external_data if e.key == "location"})
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


def _all_tensors(model) -> list:
    """Initializers and Constant-node tensors of the main graph (for external data)."""
    tensors = list(model.graph.initializer)
    for n in model.graph.node:
        for a in n.attribute:
            if a.HasField("t"):
                tensors.append(a.t)
    return tensors


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
                  observe: Callable[..., dict] | None = None) -> tuple["onnx.ModelProto", dict]:  # noqa: F821
    """Prepare the user's model for layer split and import.

    Steps: load and check; drop initializers from the graph inputs (IR < 4 style);
    set symbolic or missing input dimensions (``input_shapes``, else 1); upgrade the
    default-domain opset to ``target_opset`` when lower (IREE's importer legalizes
    several ops only from opset 17, notes/toolchain.md section 4), unless the upgrade
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
            (:mod:`torq_gen_config.model_run`) and returns ``{"types": {name: observed
            type}, "info": {...}}``; ``want`` are the subgraph's inputs in subgraph mode
            (the caller keeps their values: the subgraph's realistic inputs). The
            observed types fill in what static inference left unknown and replace
            declared types the run contradicts (a warning each); ``info`` goes to
            ``info["model_run"]``.
        conversions: ``(key, convert)`` pairs applied in order to the (cut) model, e.g.
            ``("bf16", precision.dtype_conversion.convert_to_bf16)`` for
            ``--auto-convert-bf16`` (seed 001 section 5; notes/reference_tool.md s6; the
            caller raises ``target_opset`` to what they need). ``convert(model)`` returns
            ``(model, report)`` with ``report["origin"]`` (per new node, the index of the
            node it comes from); the reports go to ``info["precision"][key]``. Nodes a
            conversion inserts (Casts) belong to the user node they serve. Passed in by
            the caller, so that model preparation does not depend on the precision modes.

    Returns:
        ``(prepared_model, info)``; ``info`` is JSON-safe and holds
        ``user_nodes`` (see :func:`user_node_table`; in subgraph mode only the
        nodes the subgraph holds, with their indices in the user's model),
        ``prepared_nodes`` (per prepared node: ``op_type``, ``graph_index`` of the
        user node it comes from), ``fixed_dims``, ``opset`` (original, prepared),
        ``warnings``, and in subgraph mode ``subgraph`` (the resolved ends, the
        subgraph's inputs and outputs, the constant nodes taken from outside the range).

    Raises:
        ModelError: see :func:`load_model`; an int64 constant out of int32 range
            (the int32 conversion), or a converted model that fails the checker.
        ConfigError: an unknown subgraph name or a reversed range; an
            ``input_shapes`` entry that names no input or contradicts a static dim.
    """
    import onnx
    from onnx import version_converter

    model = load_model(src)
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
        onnx.checker.check_model(model)
    except Exception as e:
        info["warnings"].append(f"prepared model does not pass the ONNX checker: {_one_line(e)}")
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
    from .subgraph import CONFIG_KEYS, extract_subgraph, resolve_range

    rng = resolve_range(info["user_nodes"], subgraph[0], subgraph[1], labels=CONFIG_KEYS)
    return list(extract_subgraph(model, origin, rng["from"]["graph_index"], rng["to"]["graph_index"])[2]["inputs"])


def _cut_subgraph(model, origin: list[int], info: dict, subgraph: tuple[str, str]):
    """Subgraph mode: replace the prepared model by the subgraph; keep the user's
    indices (``info["user_nodes"]`` keeps the entries of the nodes it holds)."""
    import onnx

    from .subgraph import CONFIG_KEYS, extract_subgraph, resolve_range

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


def fix_symbolic_dims(model: "onnx.ModelProto", input_shapes: Mapping[str, list[int]] | None = None,  # noqa: F821
                      shape_sources: Mapping[str, str] | None = None) -> list[dict]:
    """Give every symbolic (``dim_param``) or unknown input dimension a value, in place:
    the one ``input_shapes`` gives (``--input-shapes``, or the shape of an
    ``--input-data`` array); else the value a dim of the same name (``batch``, ``seq``)
    got on another input, so inputs that share a dim stay consistent; else 1. Static
    dims, zero-size ones included, are kept.

    Graph outputs and value_info with symbolic dims are cleared so that shape
    inference recomputes them from the fixed inputs.

    Args:
        input_shapes: graph input name -> full shape (ints); each entry must name a
            graph input, have its rank and agree with its static dims.
        shape_sources: input name -> where its shape came from (``"--input-shapes"``,
            ``"--input-data"``), recorded with each dim (default ``"--input-shapes"``).

    Returns:
        One record per changed dimension: ``{"input", "axis", "was", "to", "source"}``
        (``source``: ``"--input-shapes"``/``"--input-data"``, ``"dim 'batch' of x"`` or
        ``"default 1"``), JSON-safe.

    Raises:
        ConfigError: an ``input_shapes`` entry names no input, has another rank, or
            contradicts a static dim; two given shapes give one named dim two values.
    """
    shapes = {k: [int(d) for d in v] for k, v in (input_shapes or {}).items()}
    sources = dict(shape_sources or {})
    names = [i.name for i in model.graph.input]
    unknown = sorted(set(shapes) - set(names))
    if unknown:
        raise ConfigError(f"--input-shapes names {', '.join(map(repr, unknown))}, which the model does not have as "
                          f"input; its inputs are {', '.join(map(repr, names))}")
    named: dict[str, tuple[int, str]] = {}  # dim_param -> (value, "dim 'p' of input")
    for inp in model.graph.input:
        tt = inp.type.tensor_type
        given = shapes.get(inp.name)
        if given is None:
            continue
        if tt.HasField("shape") and len(tt.shape.dim) != len(given):
            raise ConfigError(f"--input-shapes {inp.name}:{'x'.join(map(str, given))} has rank {len(given)}, "
                              f"the model's input has rank {len(tt.shape.dim)} ({_dims_text(tt.shape.dim)})")
        if not tt.HasField("shape"):
            for _ in given:
                tt.shape.dim.add()
        for axis, (d, g) in enumerate(zip(tt.shape.dim, given)):
            if d.HasField("dim_value") and d.dim_value != g:
                raise ConfigError(f"--input-shapes {inp.name}:{'x'.join(map(str, given))}: dim {axis} is "
                                  f"{d.dim_value} in the model ({_dims_text(tt.shape.dim)}); only symbolic dims "
                                  "can be set")
            if d.HasField("dim_param") and d.dim_param:
                seen = named.get(d.dim_param)
                if seen is not None and seen[0] != g:
                    raise ConfigError(f"the shapes given for the inputs disagree on the symbolic dim "
                                      f"{d.dim_param!r}: {seen[0]} ({seen[1]}) and {g} (dim {axis} of {inp.name})")
                named.setdefault(d.dim_param, (g, f"dim {axis} of {inp.name}"))
    changed = []
    for inp in model.graph.input:
        tt = inp.type.tensor_type
        if not tt.HasField("shape"):
            continue
        given = shapes.get(inp.name)
        for axis, d in enumerate(tt.shape.dim):
            if d.HasField("dim_value"):
                continue
            param = d.dim_param if d.HasField("dim_param") else ""
            was = param or "?"
            if given is not None:
                to, source = given[axis], sources.get(inp.name, "--input-shapes")
            elif param and param in named:
                to, source = named[param][0], f"dim {param!r} of {named[param][1].split(' of ', 1)[1]}"
            else:
                to, source = 1, "default 1"
            d.Clear()
            d.dim_value = to
            changed.append({"input": inp.name, "axis": axis, "was": was, "to": to, "source": source})
    if changed:
        for vi in list(model.graph.value_info):
            if any(not dd.HasField("dim_value") for dd in vi.type.tensor_type.shape.dim):
                model.graph.value_info.remove(vi)
        for out in model.graph.output:
            tt = out.type.tensor_type
            if tt.HasField("shape") and any(not dd.HasField("dim_value") for dd in tt.shape.dim):
                tt.ClearField("shape")
    return changed


def _dims_text(dims) -> str:
    return "x".join(str(d.dim_value) if d.HasField("dim_value") else (d.dim_param or "?") for d in dims) or "scalar"


def model_signature(model: "onnx.ModelProto") -> dict:  # noqa: F821
    """Names, dtypes and shapes of the graph inputs (initializers excluded) and outputs:
    ``{"inputs": [[name, elem_type, dims]], "outputs": [...]}`` with dims as ints, the
    dim_param string, or None."""
    inits = {t.name for t in model.graph.initializer}

    def entry(vi):
        tt = vi.type.tensor_type
        dims = None
        if tt.HasField("shape"):
            dims = [d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in tt.shape.dim]
        return [vi.name, tt.elem_type, dims]

    return {"inputs": [entry(i) for i in model.graph.input if i.name not in inits],
            "outputs": [entry(o) for o in model.graph.output]}


def signature_changes(before: dict, after: dict) -> list[str]:
    """What an opset upgrade changed in the model's signature (:func:`model_signature`
    before and after): one line per changed input or output (name, dtype, shape), empty
    when it kept them. onnx's converter changes some (Scan-8 -> 9 drops the batch axis
    of every input); declared output dims that are unknown on one side are not a change.
    """
    from onnx import helper

    def text(e) -> str:
        try:
            dt = helper.tensor_dtype_to_np_dtype(e[1]).name
        except Exception:
            dt = str(e[1])
        return f"{dt}[{'x'.join('?' if d is None else str(d) for d in e[2])}]" if e[2] is not None else f"{dt}[?]"

    changes = []
    for kind in ("inputs", "outputs"):
        a, b = before[kind], after[kind]
        if [e[0] for e in a] != [e[0] for e in b]:
            changes.append(f"{kind} {[e[0] for e in a]} became {[e[0] for e in b]}")
            continue
        for x, y in zip(a, b):
            same_shape = x[2] is None or y[2] is None if kind == "outputs" else x[2] == y[2]
            if kind == "outputs" and x[2] is not None and y[2] is not None:
                same_shape = len(x[2]) == len(y[2]) and all(
                    p == q or not isinstance(p, int) or not isinstance(q, int) for p, q in zip(x[2], y[2]))
            if x[1] != y[1] or not same_shape:
                changes.append(f"{kind[:-1]} {x[0]!r} {text(x)} -> {text(y)}")
    return changes


def trace_node_origins(model: "onnx.ModelProto", n_user_nodes: int,  # noqa: F821
                       user_nodes: list[dict] | None = None) -> list[int | None]:
    """For each node of ``model`` (after the opset upgrade), the graph index of the
    user node it comes from.

    Nodes keep their tag name through the converter. A user node the converter
    replaced by a new, unnamed node (Upsample-9 becomes Resize) is found by its
    output names. Other added nodes (expansions such as Softmax-9 ->
    Shape/Flatten/Softmax/Reshape) are attributed by data flow: first to the group
    of a consumer, then (for sinks) to the group of a producer, and finally to the
    nearest preceding tagged node.
    """
    nodes = list(model.graph.node)
    origin: list[int | None] = []
    for n in nodes:
        if n.name.startswith(_TAG) and n.name[len(_TAG):].isdigit() and int(n.name[len(_TAG):]) < n_user_nodes:
            origin.append(int(n.name[len(_TAG):]))
        else:
            origin.append(None)
    if all(o is not None for o in origin):
        return origin
    lost = set(range(n_user_nodes)) - {o for o in origin if o is not None}
    if user_nodes:
        lost -= {i for i in lost if user_nodes[i]["op_type"] == "Constant" and not user_nodes[i]["inputs"]}
        by_output = {t: i for i in lost for t in user_nodes[i]["outputs"] if t}
        for j, n in enumerate(nodes):
            if origin[j] is None:
                hit = next((by_output[t] for t in n.output if t in by_output), None)
                if hit is not None:
                    origin[j] = hit
        lost -= set(o for o in origin if o is not None)
    if lost:
        # a replaced node whose outputs were renamed too: the unnamed nodes in the gap
        # between the tagged neighbours of exactly one lost node are its replacement
        tagged = [(j, o) for j, o in enumerate(origin) if o is not None]
        bounds = [(-1, -1)] + tagged + [(len(nodes), n_user_nodes)]
        for (ja, ta), (jb, tb) in zip(bounds, bounds[1:]):
            in_gap = [i for i in lost if ta < i < tb]
            if len(in_gap) == 1:
                for j in range(ja + 1, jb):
                    if origin[j] is None:
                        origin[j] = in_gap[0]
    producer = {}
    consumers = defaultdict(list)
    for j, n in enumerate(nodes):
        for t in n.output:
            if t:
                producer[t] = j
        for t in n.input:
            if t:
                consumers[t].append(j)
    changed = True
    while changed:
        changed = False
        for j, n in enumerate(nodes):
            if origin[j] is not None:
                continue
            cons = [c for t in n.output for c in consumers.get(t, [])]
            got = next((origin[c] for c in cons if origin[c] is not None), None)
            if got is None and not cons:
                prods = [producer[t] for t in n.input if t in producer]
                got = next((origin[p] for p in prods if origin[p] is not None), None)
            if got is not None:
                origin[j] = got
                changed = True
    last = None
    for j in range(len(nodes)):
        if origin[j] is None:
            origin[j] = last if last is not None else 0
        last = origin[j]
    return origin


def _restore_tensor_names(model: "onnx.ModelProto", user_nodes: list[dict], origin: list[int | None]) -> None:  # noqa: F821
    """Give back the user's tensor names that the opset converter replaced.

    For a user node that stayed a single node with the same number of outputs, its
    outputs are renamed to the user's names (everywhere they are referenced) when the
    user's name is not taken by another tensor. Expanded nodes keep the converter's
    internal names (their graph-visible outputs keep the user's names already).
    """
    groups = defaultdict(list)
    for j, o in enumerate(origin):
        groups[o].append(j)
    nodes = model.graph.node
    used = set()
    for n in nodes:
        used.update(t for t in n.output if t)
        used.update(t for t in n.input if t)
    used.update(i.name for i in model.graph.input)
    used.update(t.name for t in model.graph.initializer)
    rename: dict[str, str] = {}
    for o, js in groups.items():
        if o is None or len(js) != 1:
            continue
        node = nodes[js[0]]
        want = user_nodes[o]["outputs"]
        if len(want) != len(node.output):
            continue
        for cur, new in zip(node.output, want):
            if cur and new and cur != new and new not in used:
                rename[cur] = new
                used.add(new)
    if not rename:
        return
    for n in nodes:
        for k, t in enumerate(n.input):
            if t in rename:
                n.input[k] = rename[t]
        for k, t in enumerate(n.output):
            if t in rename:
                n.output[k] = rename[t]
    for vi in list(model.graph.value_info) + list(model.graph.output):
        if vi.name in rename:
            vi.name = rename[vi.name]


def _restore_node_names(model, original_names: list[str], origin: list[int], user_nodes: list[dict]) -> None:
    """Put the user's node names back after the opset upgrade.

    In an expansion, the node of the user's op type keeps the user's name and the
    added nodes get ``<name>/<OpType>_<k>`` (or stay unnamed when the user's node had
    no name), so node names stay unique.
    """
    taken: set[int] = set()
    for j, n in enumerate(model.graph.node):
        o = origin[j]
        name = original_names[o]
        if o not in taken and n.op_type == user_nodes[o]["op_type"]:
            taken.add(o)
            n.name = name
        else:
            n.name = f"{name}/{n.op_type}_{j}" if name else ""
    for j, n in enumerate(model.graph.node):  # a group without a node of the user's op type
        o = origin[j]
        if o not in taken:
            taken.add(o)
            n.name = original_names[o]


def _one_line(e: BaseException) -> str:
    """First non-empty line of an exception message, at most 300 characters."""
    text = str(e).strip() or type(e).__name__
    line = next((ln.strip() for ln in text.splitlines() if ln.strip()), text)
    return line[:300]
