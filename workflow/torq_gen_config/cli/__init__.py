"""The commands (``torq-gen-config discover|run|view|edit|report|conformance``).

Each command module imports its parser's needs at its top and its implementation (the
workflow API, the report, the full-model run, the model and reference packages) inside the
function that runs the command: ``--help`` and an argument error load the parsers only and
stay fast (tests/unit/test_imports.py). These are the package's documented
function-level imports; everything below the CLI imports at its top, the heavy third-party
modules through core/lazy.py.
"""
