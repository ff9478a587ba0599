"""Tracing the user's nodes through the opset upgrade.

``onnx.version_converter`` renames tensors and can expand one node into several, so the
preparation tags every user node with a unique name before the conversion
(:data:`_TAG`), maps each converted node back to the user node it comes from
(:func:`trace_node_origins`), restores the user's tensor and node names, and checks that
the conversion kept the model's signature (:func:`model_signature`,
:func:`signature_changes`); docs/toolchain.md, 'Opset 17 legalization'.
"""

from __future__ import annotations

from collections import defaultdict

from ..core.lazy import helper

#: Prefix of the temporary node names used to trace nodes through the opset upgrade.
_TAG = "__tgc_node_"


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

