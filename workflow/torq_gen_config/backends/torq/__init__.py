"""TORQ backend: compile a layer with ``torq-compile`` forced onto one TORQ executor
(NSS, CSS or Host), run it with ``torq-run-module``.

Executor options (all optional):

``executor`` (``"nss"`` | ``"css"`` | ``"host"``; default: the executor's name)
    The TORQ executor the layer is forced onto. The forcing is done with the
    compiler's disable flags (the layer-ID-keyed ``--torq-executor-map`` of the
    reference tool never matched anything in the C++ pass, see
    ``docs/torq_backend.md``):

    - nss:  ``--torq-disable-css --torq-disable-host``
    - css:  ``--torq-disable-slices --torq-disable-host``
    - host: ``--torq-disable-slices --torq-disable-css``
``torq_hw`` (str, default ``"default"``)
    ``torq-compile --torq-hw=<torq_hw>`` (``default`` is the SL2610).
``torq_hw_type`` (str, default ``"sim"``)
    ``torq-run-module --torq_hw_type=<torq_hw_type>``. For ``sim`` and ``aws_fpga``
    the compile also gets ``--torq-target-host-triple=native`` (the host code runs
    on this machine), as the reference tool does.
``compile_flags`` (list of str)
    Extra ``torq-compile`` flags, after the forcing flags.
``run_flags`` (list of str)
    Extra ``torq-run-module`` flags, after ``--torq_hw_type``.

Command lines (``<work>`` is the job's work directory, absolute)::

    torq-compile <layer.mlir> -o <work>/module.vmfb --torq-hw=<torq_hw>
        [--torq-target-host-triple=native] <forcing flags> <compile_flags>
    torq-run-module --module=<work>/module.vmfb --function=main
        --output=@<work>/outputs/output_0.bin ... --torq_hw_type=<torq_hw_type> <run_flags>
        --input=<shape>x<type>=@<work>/inputs/input_0.bin ...

Inputs are written as raw little-endian ``.bin`` files and described with IREE's
type names (``f32``, ``f16``, ``bf16``, ``f64``, ``i1`` for bool, ``i8`` ... ``i64``,
``ui8`` ... ``ui64``; a scalar is ``--input=f32=@file``). Outputs are read back from
the raw ``.bin`` files the runtime writes, with the shape and dtype of the layer's
MLIR signature (or given by the caller, see :meth:`TorqBackend.run`); one dynamic
dimension is inferred from the file size.

The full-model compile (all layers, placed by the compiler JSON) is built by
:func:`full_model_compile_argv`: no forcing flags, ``--torq-executor-map=<compiler
JSON>`` last.

Tools: see :func:`find_torq_tool` (``$TORQ_COMPILE`` / ``$TORQ_RUN_MODULE``,
``$TORQ_TOOL_PATH``, the installed ``torq`` wheels, the build tree, ``PATH``). A
missing tool is a ``compile`` (``torq-compile``) or ``run`` (``torq-run-module``)
error verdict whose message names every place searched.
"""

from __future__ import annotations

from .backend import TorqBackend
from .tensors import input_spec, iree_type_name, read_output_bin, write_input_bin
from .toolchain import (
    FORCING_FLAGS,
    TOOLS,
    TORQ_EXECUTORS,
    find_torq_tool,
    full_model_compile_argv,
    run_module_argv,
    tool_search_places,
)

__all__ = [
    "TorqBackend",
    "TORQ_EXECUTORS",
    "FORCING_FLAGS",
    "TOOLS",
    "find_torq_tool",
    "tool_search_places",
    "full_model_compile_argv",
    "run_module_argv",
    "iree_type_name",
    "input_spec",
    "write_input_bin",
    "read_output_bin",
]
