"""The one lazy-import point: the heavy third-party modules, named once here and loaded on first use.

Every module of the package imports what it needs at its top. The heavy dependencies come from
here as stand-ins (``from ..core.lazy import np, onnx``) that import the real module the first
time an attribute is read, once per process, as Polygraphy's ``mod.lazy_import`` does. What this
keeps fast: ``torq-gen-config --help`` and every command's argument checks, a refusal of a bad
input, ``view``/``edit`` of a report, and Snakemake's parse of the Snakefile (a dry run, ``--lint``,
every job's start), none of which needs ONNX, ONNX Runtime, NumPy or the IREE bindings; importing
``onnx`` alone costs more than the whole ``--help``.

Through here: numpy, ml_dtypes; onnx (and its helper, numpy_helper, version_converter, reference,
defs, node tests); onnxruntime (and its quantization); the IREE compiler's Python bindings (ir, the
dialects, the ONNX importer) and runtime; plotly; rich's display classes; Snakemake's API, settings,
scheduler and logging; jsonschema, referencing, yaml, filelock, protobuf's DecodeError; of the
standard library, the few modules that cost ``--help`` milliseconds (importlib.metadata,
importlib.resources, platform, zipfile, difflib). No module
of the package imports these directly. A module that uses one at import time (a table of
``onnx.TensorProto`` members, a class derived from a rich class) loads it then: keep such uses out
of the modules that ``--help`` imports (tests/unit/test_imports.py).

A stand-in reads the module's attribute at each use (a test's ``monkeypatch`` of the module is
seen); a submodule the package does not import itself (``onnx.reference``) is imported on first
use. A missing package raises ``ModuleNotFoundError`` (an ``ImportError``: a caller that treats
an absent optional package, e.g. the IREE bindings, as "unavailable" still does) with a one-line
message naming the package to install.
"""

from __future__ import annotations

import importlib
import types

# the pip package that provides each top-level module, for the message when it is missing
_DISTRIBUTIONS = {"iree": "iree-base-compiler / iree-base-runtime", "yaml": "PyYAML", "google": "protobuf"}


class LazyModule(types.ModuleType):
    """A stand-in for the module ``name``: imports it on first attribute access, then forwards."""

    def __init__(self, name: str):
        super().__init__(name)
        self.__dict__["_lazy_module"] = None

    def _load(self) -> types.ModuleType:
        module = self.__dict__["_lazy_module"]
        if module is None:
            try:
                module = importlib.import_module(self.__name__)
            except ModuleNotFoundError as e:
                missing = e.name or self.__name__
                if not (self.__name__ == missing or self.__name__.startswith(missing + ".")):
                    raise  # the package is there; something it imports is not: its own error
                top = missing.split(".")[0]
                raise ModuleNotFoundError(
                    f"torq-gen-config needs the Python module {missing!r}, which is not installed "
                    f"(pip install {_DISTRIBUTIONS.get(top, top)})", name=missing) from e
            self.__dict__["_lazy_module"] = module
        return module

    def __getattr__(self, attr: str):
        module = self._load()
        try:
            return getattr(module, attr)
        except AttributeError:
            try:  # a submodule its package does not import itself
                return importlib.import_module(f"{self.__name__}.{attr}")
            except ModuleNotFoundError as e:
                if e.name != f"{self.__name__}.{attr}":
                    raise
            raise

    def __dir__(self):
        return dir(self._load())

    def __repr__(self) -> str:
        state = "loaded" if self.__dict__["_lazy_module"] is not None else "not loaded yet"
        return f"<lazy module {self.__name__!r} ({state})>"


def lazy_import(name: str) -> LazyModule:
    """The stand-in for module ``name`` (dotted for a submodule: ``lazy_import("onnx.helper")``)."""
    return LazyModule(name)


def load(module: types.ModuleType) -> types.ModuleType:
    """The real module behind a stand-in, imported now: for an import that must happen in a
    given context (``onnxruntime.quantization`` inside the root-logger guard); a module that
    is not a stand-in is returned as it is."""
    return module._load() if isinstance(module, LazyModule) else module


np = lazy_import("numpy")
ml_dtypes = lazy_import("ml_dtypes")

onnx = lazy_import("onnx")
helper = lazy_import("onnx.helper")
numpy_helper = lazy_import("onnx.numpy_helper")
version_converter = lazy_import("onnx.version_converter")
onnx_node_tests = lazy_import("onnx.backend.test.case.node")

ort = lazy_import("onnxruntime")
oq = lazy_import("onnxruntime.quantization")

ir = lazy_import("iree.compiler.ir")
arith = lazy_import("iree.compiler.dialects.arith")
flow = lazy_import("iree.compiler.dialects.flow")
tensor = lazy_import("iree.compiler.dialects.tensor")
util = lazy_import("iree.compiler.dialects.util")
onnx_importer = lazy_import("iree.compiler.extras.onnx_importer")
iree_importer_overrides = lazy_import("iree.compiler.tools.import_onnx.importer_externalization_overrides")
rt = lazy_import("iree.runtime")

go = lazy_import("plotly.graph_objects")
pio = lazy_import("plotly.io")
plotly_subplots = lazy_import("plotly.subplots")
plotly_offline = lazy_import("plotly.offline")

rich_box = lazy_import("rich.box")
rich_console = lazy_import("rich.console")
rich_measure = lazy_import("rich.measure")
rich_text = lazy_import("rich.text")
rich_table = lazy_import("rich.table")
rich_progress = lazy_import("rich.progress")
rich_progress_bar = lazy_import("rich.progress_bar")
rich_live = lazy_import("rich.live")
rich_filesize = lazy_import("rich.filesize")

snakemake_api = lazy_import("snakemake.api")
snakemake_cli = lazy_import("snakemake.cli")
snakemake_settings = lazy_import("snakemake.settings.types")
snakemake_job_scheduler = lazy_import("snakemake.scheduling.job_scheduler")
snakemake_greedy = lazy_import("snakemake.scheduling.greedy")
snakemake_logging = lazy_import("snakemake.logging")
snakemake_exceptions = lazy_import("snakemake_interface_common.exceptions")
snakemake_logger_plugins = lazy_import("snakemake_interface_logger_plugins.common")

jsonschema = lazy_import("jsonschema")
referencing = lazy_import("referencing")
yaml = lazy_import("yaml")
filelock = lazy_import("filelock")
protobuf_message = lazy_import("google.protobuf.message")

# standard library modules that cost --help milliseconds (importlib.metadata brings email, zipfile, csv)
difflib = lazy_import("difflib")
metadata = lazy_import("importlib.metadata")
platform = lazy_import("platform")
resources = lazy_import("importlib.resources")
zipfile = lazy_import("zipfile")
