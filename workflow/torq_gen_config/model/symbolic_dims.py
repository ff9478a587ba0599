"""Static input shapes: give every symbolic or unknown input dim of the user's model a value
(``--input-shapes``, an ``--input-data`` array's shape, a same-named dim, else 1)."""

from __future__ import annotations

from typing import Mapping

from ..core.errors import ConfigError


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

