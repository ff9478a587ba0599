"""Static input shapes: give every dynamic input dim of the user's model a value.

A dim is *dynamic* where ONNX Runtime takes any size for it: a ``dim_param`` (any
name), a dim with neither ``dim_value`` nor ``dim_param``, or a negative ``dim_value``
(exporters write ``-1``). A ``dim_value`` of 0 is a zero-size dim, as in ONNX Runtime
(it takes only 0 there). A dim named ``?`` or with an empty name is unknown per
position: two such dims are not the same dim. Every other name is one dim wherever it
appears (``batch`` on two inputs gets one value).

Where a dynamic dim's value comes from, first that applies (docs/shapes_and_inputs.md):

1. ``--input-shapes`` (or the shape of the ``--input-data`` array);
2. a dim of the same name that got a value earlier (on this or another input);
3. the model's metadata: Ultralytics exports write ``imgsz`` (``[640, 640]``) and
   ``batch``; they give dims 2, 3 and 0 of a 4-D input;
4. dim 0 (the batch): 1;
5. the other dims of an input of rank 3 or more: the smallest of B, 2B, 4B, ... 32B
   (per axis, B: the least multiple of S that is at least 32, S the input's total stride
   along that axis, :func:`input_stride`, 1 without strided convolutions or pools; a
   recognizer that reduces H by 48 and W by 8 gets 48 x 32: a feature map smaller
   than a kernel is legal but not what the model is for, and IREE's compile of such a
   degenerate Conv fails where a real size passes) for which onnx's strict shape inference accepts the whole model without
   a negative or (from non-empty inputs) zero-size dim, on the dims after N, C (NCHW), else on those between N and C (NHWC);
   when none is accepted, B on the NCHW dims (the whole-model run then shows what
   fails: :func:`check_run_with_guessed_dims`);
6. the other dims: 1.
"""

from __future__ import annotations

import ast
from fractions import Fraction
from typing import Mapping

from ..core.errors import ConfigError
from ..core.lazy import numpy_helper, onnx
from .graph import copy_proto

#: source of a dim that nothing gave a value (the batch dim, or a model without strides)
DEFAULT_SOURCE = "default 1"
#: source of a dim set to a multiple of the input's total stride (``STRIDE_SOURCE.format(32)``)
STRIDE_SOURCE = "the model's stride {}"
#: source of a dim set to the smallest size > 1 the model's shapes accept (no strides)
SHAPES_SOURCE = "the smallest size the model's shapes accept"
#: the ops whose ``strides`` attribute divides the spatial dims
_STRIDED_OPS = {"Conv", "ConvInteger", "QLinearConv", "MaxPool", "AveragePool", "LpPool"}
#: the multiples of the base size tried for the spatial dims
_STRIDE_MULTIPLES = (1, 2, 4, 8, 16, 32)
#: the least spatial size tried (the base is the least multiple of the stride >= this)
MIN_SPATIAL = 32
#: placeholder source of a dim whose size :func:`_choose_strided_sizes` chooses
_CHOSEN_BELOW = "chosen from the strides"
#: dim names that mean "unknown" (each such dim is its own)
_ANONYMOUS = ("", "?")


def is_dynamic(d) -> bool:
    """True for a dim that ONNX Runtime takes any size for: a ``dim_param``, no value
    at all, or a negative ``dim_value`` (a ``TensorShapeProto.Dimension``)."""
    return not d.HasField("dim_value") or d.dim_value < 0


def dim_name(d) -> str | None:
    """The name that ties a dynamic dim to others of that name, or None for a static dim
    and for one named ``?``, with an empty name or no name (unknown per position)."""
    if not is_dynamic(d) or not d.HasField("dim_param") or d.dim_param.strip() in _ANONYMOUS:
        return None
    return d.dim_param


def declared_shape(vi) -> tuple[int | None, ...] | None:
    """The shape a graph input (``ValueInfoProto``) declares, as ONNX Runtime reads it:
    one int per static dim, None per dynamic dim (:func:`is_dynamic`); None when it
    declares no shape (any rank is taken)."""
    tt = vi.type.tensor_type
    if not tt.HasField("shape"):
        return None
    return tuple(None if is_dynamic(d) else int(d.dim_value) for d in tt.shape.dim)


def dims_text(dims) -> str:
    """``-1x3x?x?``: the dims of a ``TensorShapeProto`` as written in the model."""
    return "x".join(str(d.dim_value) if d.HasField("dim_value") else (d.dim_param or "?") for d in dims) or "scalar"


def fix_symbolic_dims(model: "onnx.ModelProto", input_shapes: Mapping[str, list[int]] | None = None,  # noqa: F821
                      shape_sources: Mapping[str, str] | None = None) -> list[dict]:
    """Give every dynamic input dim (:func:`is_dynamic`) a value, in place, by the rule
    of this module's docstring. Static dims, zero-size ones included, are kept. Inputs
    that declare no shape take the rank of their given shape.

    Graph outputs and value_info with dynamic dims are cleared so that shape
    inference recomputes them from the fixed inputs.

    Args:
        input_shapes: graph input name -> full shape (ints); each entry must name a
            graph input, have its rank and agree with its static dims.
        shape_sources: input name -> where its shape came from (``"--input-shapes"``,
            ``"--input-data"``), recorded with each dim (default ``"--input-shapes"``).

    Returns:
        One record per changed dimension: ``{"input", "axis", "was", "to", "source"}``
        (``was``: the dim as declared, ``-1``, ``?``, ``batch``; ``source``:
        ``"--input-shapes"``/``"--input-data"``, ``"dim 'batch' of x"``, ``"model
        metadata imgsz"``, ``"the model's stride 32"``, ``"the smallest size the model's
        shapes accept"`` or ``"default 1"``), JSON-safe.

    Raises:
        ConfigError: an ``input_shapes`` entry names no input, has another rank, or
            contradicts a static dim; two given shapes give one named dim two values;
            an input declares no shape and none is given.
    """
    shapes = {k: [int(d) for d in v] for k, v in (input_shapes or {}).items()}
    sources = dict(shape_sources or {})
    names = [i.name for i in model.graph.input]
    unknown = sorted(set(shapes) - set(names))
    if unknown:
        raise ConfigError(f"--input-shapes names {', '.join(map(repr, unknown))}, which the model does not have as "
                          f"input; its inputs are {', '.join(map(repr, names))}")
    named: dict[str, tuple[int, str]] = {}  # dim name -> (value, "dim 'p' of input")
    for inp in model.graph.input:
        tt = inp.type.tensor_type
        given = shapes.get(inp.name)
        if given is None:
            continue
        if tt.HasField("shape") and len(tt.shape.dim) != len(given):
            raise ConfigError(f"--input-shapes {inp.name}:{'x'.join(map(str, given))} has rank {len(given)}, "
                              f"the model's input has rank {len(tt.shape.dim)} ({dims_text(tt.shape.dim)})")
        for axis, (d, g) in enumerate(zip(tt.shape.dim, given)):
            if not is_dynamic(d) and d.dim_value != g:
                raise ConfigError(f"--input-shapes {inp.name}:{'x'.join(map(str, given))}: dim {axis} is "
                                  f"{d.dim_value} in the model ({dims_text(tt.shape.dim)}); only its dynamic dims "
                                  "can be set")
            name = dim_name(d)
            if name is not None:
                seen = named.get(name)
                if seen is not None and seen[0] != g:
                    raise ConfigError(f"the shapes given for the inputs disagree on the symbolic dim "
                                      f"{name!r}: {seen[0]} ({seen[1]}) and {g} (dim {axis} of {inp.name})")
                named.setdefault(name, (g, f"dim {axis} of {inp.name}"))
    for inp in model.graph.input:
        tt = inp.type.tensor_type
        if not tt.HasField("shape") and inp.name in shapes:
            tt.shape.SetInParent()
            for _ in shapes[inp.name]:
                tt.shape.dim.add()
        elif not tt.HasField("shape") and tt.HasField("elem_type"):
            raise ConfigError(f"the model's input {inp.name!r} declares no shape (any rank); give it one with "
                              f"--input-shapes {inp.name}:DIMS (e.g. {inp.name}:1x3x224x224) or --input-data")
    meta = metadata_dims(model)
    changed: list[dict] = []
    strided: list[tuple] = []  # (dim, record, rank, strides): filled from the total strides, decided below
    leaders: dict[str, dict] = {}  # dim name -> the record of its first dim, when its size is chosen below
    followers: list[tuple] = []  # (dim, record, leader record): same-named dims of a strided one
    channels_last = True  # every strided input is [N, ?, ?, C] with a static C: NHWC is tried first
    for inp in model.graph.input:
        tt = inp.type.tensor_type
        if not tt.HasField("shape"):
            continue
        given = shapes.get(inp.name)
        rank = len(tt.shape.dim)
        stride = None
        image = rank == 4 and is_dynamic(tt.shape.dim[2]) and is_dynamic(tt.shape.dim[3])  # metadata's H, W
        for axis, d in enumerate(tt.shape.dim):
            if not is_dynamic(d):
                continue
            name = dim_name(d)
            was = dims_text([d])
            if given is not None:
                to, source = given[axis], sources.get(inp.name, "--input-shapes")
            elif name is not None and name in named:
                to, source = named[name][0], f"dim {name!r} of {named[name][1].split(' of ', 1)[1]}"
                if name in leaders:  # set with its leader once the strided sizes are chosen
                    followers.append((d, leaders[name]))
            elif image and axis in meta:
                to, source = meta[axis]
            elif axis == 0:
                to, source = 1, DEFAULT_SOURCE
            else:
                stride = input_stride(model, inp.name) if stride is None else stride
                to, source = 1, (_CHOSEN_BELOW if rank >= 3 else DEFAULT_SOURCE)
            record = {"input": inp.name, "axis": axis, "was": was, "to": to, "source": source}
            changed.append(record)
            if followers and followers[-1][0] is d:
                followers[-1] = (d, record, followers[-1][1])
            chosen = source is _CHOSEN_BELOW
            if name is not None and name not in named:
                named[name] = (to, f"dim {axis} of {inp.name}")
                if chosen:
                    leaders[name] = record
            d.Clear()
            d.dim_value = to
            if chosen:
                strided.append((d, record, rank, stride))
                channels_last = channels_last and not is_dynamic(tt.shape.dim[-1]) and is_dynamic(tt.shape.dim[1])
    if strided:
        _choose_strided_sizes(model, strided, followers, channels_last=channels_last)
    if changed:
        for vi in list(model.graph.value_info):
            if any(is_dynamic(dd) for dd in vi.type.tensor_type.shape.dim):
                model.graph.value_info.remove(vi)
        for out in model.graph.output:
            tt = out.type.tensor_type
            if tt.HasField("shape") and any(is_dynamic(dd) for dd in tt.shape.dim):
                tt.ClearField("shape")
    return changed


def metadata_dims(model: "onnx.ModelProto") -> dict[int, tuple[int, str]]:  # noqa: F821
    """The dims a model's metadata gives a 4-D (NCHW) image input: ``{axis: (value,
    source)}``, from Ultralytics' ``imgsz`` (``[H, W]`` or one int, dims 2 and 3) and
    ``batch`` (dim 0, only with ``imgsz``); empty when the model has neither or they do
    not parse as positive ints."""
    props = {p.key: p.value for p in model.metadata_props}
    try:
        size = ast.literal_eval(props["imgsz"].strip())
    except (KeyError, ValueError, SyntaxError):
        return {}
    size = [size, size] if isinstance(size, int) else list(size) if isinstance(size, (list, tuple)) else []
    if len(size) == 1:
        size = size * 2
    if len(size) != 2 or not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in size):
        return {}
    out = {2: (size[0], "model metadata imgsz"), 3: (size[1], "model metadata imgsz")}
    batch = props.get("batch", "").strip()
    if batch.isdigit() and int(batch) > 0:
        out[0] = (int(batch), "model metadata batch")
    return out


def input_stride(model: "onnx.ModelProto", name: str) -> tuple[int, ...]:  # noqa: F821
    """The total stride of the graph input ``name`` per spatial axis: for each spatial
    position of the convolutions and pools (H, W of a 2-D one), the largest factor by
    which the tensors computed from it are downsampled along it (the product of the
    ``strides`` on a path, divided by the upsampling of ``Resize``/``Upsample`` with
    constant scales and of ``ConvTranspose``; ``SpaceToDepth``/``DepthToSpace`` count
    their block size on every axis). Per axis because models downsample the axes
    differently: PaddleOCR's text recognizer reduces H by 48 (``strides`` [2, 1], an
    AveragePool [3, 2]) and W by 8, and runs only where H is a multiple of 48. An op
    whose ``strides`` have another length than the axes tracked so far (a 1-D op after
    a reshape) counts with its largest stride on every axis. ``(1,)`` for an input that
    reaches no strided op."""
    consts = {t.name: t for t in model.graph.initializer}
    for n in model.graph.node:
        if n.op_type == "Constant" and n.output and n.attribute and n.attribute[0].name == "value":
            consts[n.output[0]] = n.attribute[0].t
    factor: dict[str, tuple[Fraction, ...]] = {name: ()}
    best: tuple[Fraction, ...] = ()
    for n in model.graph.node:
        ins = [factor[t] for t in n.input if t in factor]
        if not ins:
            continue
        f = _axis_max(*ins)
        attrs = {a.name: a for a in n.attribute}
        if n.op_type in _STRIDED_OPS and "strides" in attrs and attrs["strides"].ints:
            f = _scaled(f, [Fraction(s) for s in attrs["strides"].ints])
        elif n.op_type == "ConvTranspose" and "strides" in attrs and attrs["strides"].ints:
            f = _scaled(f, [1 / Fraction(s) for s in attrs["strides"].ints])
        elif n.op_type in ("SpaceToDepth", "DepthToSpace") and "blocksize" in attrs:
            block = Fraction(attrs["blocksize"].i)
            f = _scaled(f, [block if n.op_type == "SpaceToDepth" else 1 / block] * 2)  # 4-D only: H and W
        elif n.op_type in ("Resize", "Upsample"):
            scales = _spatial_scales(consts, n.input[2] if n.op_type == "Resize" and len(n.input) > 2
                                     else n.input[1] if n.op_type == "Upsample" and len(n.input) > 1 else "")
            if scales:
                f = _scaled(f, [1 / s for s in scales])
        best = _axis_max(best, f)
        for o in n.output:
            if o:
                factor[o] = f
    return tuple(max(1, int(b)) for b in best) or (1,)


def _axis_max(*factors: tuple[Fraction, ...]) -> tuple[Fraction, ...]:
    """Per axis, the largest of ``factors`` (shorter tuples count as 1 on the axes they lack)."""
    width = max(len(f) for f in factors)
    return tuple(max((f[i] if i < len(f) else Fraction(1)) for f in factors) for i in range(width))


def _scaled(f: tuple[Fraction, ...], by: list[Fraction]) -> tuple[Fraction, ...]:
    """``f`` multiplied per axis by ``by``; when ``f`` tracks other axes than ``by``
    has (not yet any: it takes ``by``'s), every axis by ``by``'s largest factor away from 1."""
    if not f or len(f) == len(by):
        return tuple((f[i] if f else Fraction(1)) * by[i] for i in range(len(by)))
    widest = max(by, key=lambda s: max(s, 1 / s))
    return tuple(x * widest for x in f)


def _spatial_scales(consts: dict, name: str) -> list[Fraction] | None:
    """The spatial scales of a constant scales tensor (a Resize/Upsample input: the
    values after N and C), or None where it is not a constant of positive values."""
    t = consts.get(name)
    if t is None or t.data_location == onnx.TensorProto.EXTERNAL:
        return None
    values = numpy_helper.to_array(t).ravel()
    if values.size < 3 or not (values > 0).all():
        return None
    return [Fraction(float(v)).limit_denominator(64) for v in values[2:]]


def _choose_strided_sizes(model, strided: list[tuple], followers: list[tuple], *, channels_last: bool = False) -> None:
    """Set the dims of ``strided`` (``(dim, record, rank, strides)``: ``strides`` the
    input's per-axis total stride, :func:`input_stride`; filled with 1 so far) to the
    first sizes that the model's shapes accept (:func:`_shapes_accepted`): each multiple
    (:data:`_STRIDE_MULTIPLES`) of the base sizes (per spatial axis, the least multiple of
    that axis's stride that is at least :data:`MIN_SPATIAL`), on the NCHW spatial dims
    (axes >= 2), then on the NHWC ones (axes 1 .. rank - 2); the other dims of
    ``strided`` get 1. ``followers`` (``(dim, record, leader record)``: dims named as a
    strided one) take their leader's value. With ``channels_last`` (every input has a static
    last dim and a dynamic dim 1: ``[N, H, W, 3]``) the NHWC dims are tried first (an NCHW
    reading would make H the channels and fit a 1-pixel-high image). When no candidate is
    accepted, the first layout's dims get their base sizes (the whole-model run then says
    what fails) and ``unfit: True``.
    Each record's ``source`` says which rule gave its size (``default 1`` for a 1)."""

    def apply(layout: str, k: int) -> None:
        for d, rec, rank, strides in strided:
            position = rec["axis"] - 2 if layout == "nchw" else rec["axis"] - 1
            spatial = rec["axis"] >= 2 if layout == "nchw" else 1 <= rec["axis"] <= rank - 2
            stride = strides[position] if 0 <= position < len(strides) else max(strides)
            base = stride * -(-MIN_SPATIAL // stride)
            d.dim_value = rec["to"] = base * k if spatial else 1
            rec["source"] = (DEFAULT_SOURCE if rec["to"] == 1 else STRIDE_SOURCE.format(stride) if stride > 1
                             else SHAPES_SOURCE)
        for d, rec, leader in followers:
            d.dim_value = rec["to"] = leader["to"]

    tried = set()
    layouts = ("nhwc", "nchw") if channels_last else ("nchw", "nhwc")
    for layout in layouts:
        for k in _STRIDE_MULTIPLES:
            apply(layout, k)
            sizes = tuple(rec["to"] for _, rec, _, _ in strided)
            if sizes in tried:  # no dim of this layout to set: the same sizes again
                continue
            tried.add(sizes)
            if _shapes_accepted(model):
                return
    apply(layouts[0], 1)
    for _, rec, _, _ in strided:
        if rec["to"] != 1:
            rec["unfit"] = True  # said in the warning: no size tried fits the model's shapes


def _shapes_accepted(model) -> bool:
    """True when onnx's strict shape inference (with data propagation) finds no
    inconsistency in ``model`` with its current input shapes and infers no negative dim,
    nor a zero-size one unless an input has one (a convolution or pool window larger
    than its input), and no strided window is larger than its input
    (:func:`_strided_windows_fit`)."""
    probe = copy_proto(model)
    del probe.graph.value_info[:]
    for out in probe.graph.output:
        out.type.tensor_type.ClearField("shape")
    try:
        inferred = onnx.shape_inference.infer_shapes(probe, check_type=False, strict_mode=True, data_prop=True)
    except Exception:  # onnx raises InferenceError, ValidationError, RuntimeError
        return False
    empty_inputs = any(d.dim_value == 0 for vi in model.graph.input for d in vi.type.tensor_type.shape.dim)
    least = 0 if empty_inputs else 1  # a zero-size tensor from non-empty inputs: a window larger than its input
    constant = _constant_tensors(inferred)  # empty constants are what the exporter wrote (Resize's roi: [])
    if any(d.HasField("dim_value") and d.dim_value < least
           for vi in list(inferred.graph.value_info) + list(inferred.graph.output) if vi.name not in constant
           for d in vi.type.tensor_type.shape.dim):
        return False
    return _strided_windows_fit(inferred)


def _constant_tensors(model) -> set[str]:
    """The tensors of ``model``'s graph computed from constants alone: initializers,
    Constant nodes' outputs and the outputs of nodes whose inputs are all constant."""
    constant = {t.name for t in model.graph.initializer}
    for n in model.graph.node:
        if n.op_type == "Constant" or all(not i or i in constant for i in n.input):
            constant.update(o for o in n.output if o)
    return constant


def _strided_windows_fit(inferred) -> bool:
    """No strided convolution or pool (``strides`` > 1) in the shape-inferred model whose
    window is larger than its input along a spatial axis: legal with padding, but not what
    the model is for, and IREE's compile of such a window fails (PaddleOCR's detector at
    32x32: a 5x5 stride-2 depthwise Conv on a 2x2 map; at 128x128 it is 8x8 and compiles)."""
    shapes = {vi.name: [d.dim_value if d.HasField("dim_value") else None for d in vi.type.tensor_type.shape.dim]
              for vi in list(inferred.graph.value_info) + list(inferred.graph.input)}
    dims = {t.name: list(t.dims) for t in inferred.graph.initializer}
    for n in inferred.graph.node:
        attrs = {a.name: a for a in n.attribute}
        if n.op_type not in _STRIDED_OPS or "strides" not in attrs or max(attrs["strides"].ints, default=1) <= 1:
            continue
        weight = n.input[3] if n.op_type == "QLinearConv" and len(n.input) > 3 else n.input[1] if len(n.input) > 1 else ""
        kernel = list(attrs["kernel_shape"].ints) if "kernel_shape" in attrs else dims.get(weight, [])[2:]
        shape = shapes.get(n.input[0]) or []
        spatial = shape[2:2 + len(kernel)]
        if kernel and len(spatial) == len(kernel) and any(x is not None and x < k for x, k in zip(spatial, kernel)):
            return False
    return True


def guessed_dims(fixed: list[dict]) -> list[dict]:
    """The records of :func:`fix_symbolic_dims` whose size nothing gave: a dim after the
    batch set to 1 by default, to a multiple of the model's stride or to the smallest size
    its shapes accept (not the batch dim's default 1, not a given, same-named or metadata
    size)."""
    return [d for d in fixed if d["source"] == SHAPES_SOURCE or d["source"].startswith(STRIDE_SOURCE.format(""))
            or (d["source"] == DEFAULT_SOURCE and d["axis"] != 0)]


def input_shapes_option(shapes: Mapping[str, list[int]]) -> str:
    """``--input-shapes images:1x3x32x32 mask:1x32``: the option that gives these shapes."""
    return "--input-shapes " + " ".join(f"{n}:{'x'.join(map(str, s))}" for n, s in shapes.items())


def check_run_with_guessed_dims(fixed: list[dict], shapes: Mapping[str, list[int]], run: dict | None) -> str | None:
    """Judge the whole-model reference run of a model whose input dims were partly
    chosen here (:func:`guessed_dims`): when the run failed on a node, sizes the model
    does not take may be why.

    Args:
        fixed: the records of :func:`fix_symbolic_dims`.
        shapes: input name -> its full shape after fixing (``prepare.json``'s ``fixed_shapes``).
        run: the run's summary (``prepare.json``'s ``model_run``: ``ran``, ``failed_nodes``,
            ``nodes_run``, ``nodes_not_run``), or None.

    Returns:
        None when no dim was guessed, the run did not run or no node failed; else a
        warning (without ``warning:``) naming the ``--input-shapes`` that gives the sizes.

    Raises:
        ConfigError: the run failed and more nodes got no value than got one (most of
            the model would not be tested); the message names the ``--input-shapes`` to give.
    """
    guessed = guessed_dims(fixed)
    if not guessed or not run or not run.get("ran") or not run.get("failed_nodes"):
        return None
    inputs = list(dict.fromkeys(d["input"] for d in guessed))
    option = input_shapes_option({n: shapes[n] for n in inputs if n in shapes})
    chosen = "; ".join(f"{n} dim(s) {', '.join(str(d['axis']) for d in guessed if d['input'] == n)} set to "
                       f"{', '.join(str(d['to']) for d in guessed if d['input'] == n)}" for n in inputs)
    first = run["failed_nodes"][0]
    errors = "; ".join(f"{e}: {m}" for e, m in (first.get("errors") or {}).items())
    where = f"{first.get('op_type')} node {first.get('name') or first.get('graph_index')} ({errors[:200]})"
    not_run, ran = int(run.get("nodes_not_run") or 0), int(run.get("nodes_run") or 0)
    if not_run > ran:
        raise ConfigError(f"the whole-model reference run fails with the input sizes chosen for the dims nothing gave "
                          f"({chosen}): {where}; {not_run} of {not_run + ran} nodes get no value, so most layers "
                          f"could not be tested. Give the sizes the model is used at: {option} with those dims "
                          "changed (or --input-data)")
    return (f"the whole-model reference run failed on {len(run['failed_nodes'])} node(s), first {where}, with the "
            f"input sizes chosen for the dims nothing gave ({chosen}); if the model takes other sizes, give them: "
            f"{option} with those dims changed")
