"""Op-aware deterministic inputs for an ONNX model (one layer or a whole model).

Modules: :mod:`.generate` (the generator, :func:`generate_inputs`, :func:`make_inputs`),
:mod:`.site` (what a rule reads), :mod:`.tensor_types` (static dims, dtype classes),
:mod:`.rules` (the table :data:`RULES` and one module per kind of input: axes, indices,
shapes, slice, signal, values, nms). The whole model's input values (``--input-data``
or generated) are :mod:`torq_gen_config.reference.model_inputs`, a layer above this one: it casts
with the precision step's bf16 rounding, and that step draws its calibration inputs here.

Most graph inputs are data, drawn uniformly per dtype (config ``inputs``: floats in
``float_range``, integers in ``int_range``, uint8 in ``uint8_range``, bools). But an
operator may read an integer input as axes, a shape, indices, split sizes or a count,
and a float input as resize scales or a threshold; uniform values there make the op
fail ("axis 31 is not in valid range", "invalid expand shape", "Integer division by
zero") or read out of bounds. For those inputs a rule derives the values from the
consuming node: its schema (the formal name of the input), its attributes, the static
shapes of its other inputs, and its declared output shapes (graph outputs and
``value_info``), so that the op runs and produces the shape the model declares.

The rules are one table, :data:`RULES`: ``(domain, op type, formal input name) -> rule``.
The formal name comes from ``onnx.defs.get_schema(op_type, opset, domain)`` (variadic
inputs: every position of the last formal parameter). Each rule is a function of an
:class:`InputSite` (the input as that node's input) that returns the values, or None
when it cannot satisfy the op's constraint (e.g. a shape it needs is unknown); the
input then gets the plain per-dtype values (the behaviour before these rules). The
rules, with the operator spec's constraint they follow, are documented in
docs/inputs.md and in each rule's docstring (spec pages: https://onnx.ai/onnx/operators/).

Determinism: one ``numpy.random.default_rng(seed)`` stream, inputs generated in graph
input order; a rule that needs another graph input's value (``Range``'s ``limit``
needs ``start`` and ``delta``) generates that one first. An input without a rule
draws what the generator before these rules drew (same numpy calls, same order), so a
model none of whose inputs has a rule or a 0 dim keeps its values (except dtypes that
generator mishandled: strings, int4/int2 drawn as floats, float8e8m0 NaNs).
"""

from __future__ import annotations

from .generate import DEFAULT_INPUT_SETTINGS, generate_inputs, make_inputs
from .rules import RULES
from .site import InputSite
from .tensor_types import input_shape

__all__ = ["generate_inputs", "make_inputs", "DEFAULT_INPUT_SETTINGS", "InputSite", "RULES", "input_shape"]
