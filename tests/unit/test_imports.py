"""Imports at the top: each module names its imports at its top; the heavy third-party modules
(numpy, onnx, onnxruntime, the IREE bindings, plotly, ml_dtypes, rich, Snakemake, ...) come from
the one lazy-import point, core/lazy.py, and load on first use, so the commands' ``--help`` and
argument checks import none of them."""

from __future__ import annotations

import ast
import subprocess
import sys
import textwrap

import pytest
from conftest import REPO

from torq_gen_config.core import lazy

PACKAGE = REPO / "workflow" / "torq_gen_config"
MAX_FUNCTION_LEVEL_IMPORTS = 60
HEAVY = ("numpy", "onnx", "onnxruntime", "plotly", "iree", "ml_dtypes", "snakemake", "rich.console", "jsonschema")


def _function_level_imports() -> list[str]:
    """``file:line`` of each import statement whose nearest enclosing scope is a function."""
    found = []

    def walk(node, path, in_function):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.Import, ast.ImportFrom)) and in_function:
                found.append(f"{path.relative_to(PACKAGE)}:{child.lineno}")
            walk(child, path, in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)))

    for path in sorted(PACKAGE.rglob("*.py")):
        if path == PACKAGE / "core" / "lazy.py" or "__pycache__" in path.parts:
            continue
        walk(ast.parse(path.read_text(encoding="utf-8")), path, False)
    return found


def test_imports_are_at_the_top():
    """At most 60 imports inside functions (the commands' implementations in cli/, loaded when
    the command runs, and a few that say why on their line: a report edit that imports no
    backend, an optional module); everything else is imported at the top of its module."""
    found = _function_level_imports()
    assert len(found) <= MAX_FUNCTION_LEVEL_IMPORTS, f"{len(found)} function-level imports: {found}"


@pytest.mark.parametrize("argv", [["--help"], ["discover", "--help"], ["run", "--help"], ["view", "--help"],
                                  ["edit", "--help"], ["report", "--help"], ["conformance", "--help"],
                                  ["compare", "--help"], ["sweep", "--help"]])
def test_help_imports_no_heavy_module(argv):
    """``torq-gen-config [COMMAND] --help`` (and so the import of every command module) loads none
    of the heavy modules: they come through core/lazy.py."""
    code = textwrap.dedent(f"""
        import sys
        from torq_gen_config.cli.main import main
        sys.argv = ["torq-gen-config", *{argv!r}]
        try:
            main()
        except SystemExit:
            pass
        print("LOADED:" + ",".join(m for m in {HEAVY!r} if m in sys.modules))
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[-1] == "LOADED:", proc.stdout.splitlines()[-1]


def test_ck_profile_help_imports_no_heavy_module():
    code = ("import sys\nfrom torq_gen_config.ck.cli import main\nsys.argv = ['ck-profile', '--help']\n"
            "try:\n    main()\nexcept SystemExit:\n    pass\n"
            f"print('LOADED:' + ','.join(m for m in {HEAVY!r} if m in sys.modules))\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[-1] == "LOADED:"


def test_a_stand_in_loads_its_module_on_first_use():
    code = ("import sys\nfrom torq_gen_config.core.lazy import helper, np, onnx\n"
            "assert 'onnx' not in sys.modules and 'numpy' not in sys.modules\n"
            "assert onnx.TensorProto.FLOAT == 1 and 'onnx' in sys.modules\n"
            "assert helper.make_tensor_value_info is sys.modules['onnx.helper'].make_tensor_value_info\n"
            "assert onnx.reference.ReferenceEvaluator is sys.modules['onnx.reference'].ReferenceEvaluator\n"
            "assert np.float32 is sys.modules['numpy'].float32\n")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_a_missing_package_is_named_in_one_line():
    missing = lazy.lazy_import("torq_no_such_package.sub")
    with pytest.raises(ModuleNotFoundError, match=r"^torq-gen-config needs the Python module 'torq_no_such_package', "
                                                  r"which is not installed \(pip install torq_no_such_package\)$") as e:
        missing.anything
    assert isinstance(e.value, ImportError) and e.value.name == "torq_no_such_package"
    with pytest.raises(AttributeError):
        lazy.onnx.no_such_attribute_or_submodule


def test_every_stand_in_names_an_installed_module():
    import importlib.util

    stand_ins = {k: v for k, v in vars(lazy).items() if isinstance(v, lazy.LazyModule)}
    assert {"np", "onnx", "ort", "ir", "rt", "go"} <= set(stand_ins)
    for name, module in stand_ins.items():
        if module.__name__.startswith("iree.") and importlib.util.find_spec("iree.compiler") is None:
            continue  # the IREE bindings are optional here
        assert importlib.util.find_spec(module.__name__) is not None, (name, module.__name__)


def test_importing_every_module_loads_no_heavy_module():
    """No module uses a heavy module at import time (a table keyed by ``onnx.TensorProto``
    members, ``np.iinfo`` constants): Snakemake's parse of the rules, which imports the job
    modules, loads none of them."""
    modules = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE.parent).with_suffix("")
        if "__pycache__" in rel.parts or rel.name == "__main__":
            continue
        modules.append(".".join(rel.parts[:-1] if rel.name == "__init__" else rel.parts))
    code = (f"import importlib, sys\nfor m in {modules!r}:\n    importlib.import_module(m)\n"
            f"print('LOADED:' + ','.join(m for m in {HEAVY!r} if m in sys.modules))\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[-1] == "LOADED:"


def test_constants_written_out_match_their_sources():
    """The values written out to keep imports light are those of onnx and numpy."""
    import ml_dtypes
    import numpy as np
    import onnx

    from torq_gen_config.precision import bf16_rounding, narrowing, narrowing_plan

    T = onnx.TensorProto
    assert (narrowing_plan._FLOAT, narrowing_plan._INT32, narrowing_plan._INT64, narrowing_plan._UINT32,
            narrowing_plan._UINT64, narrowing_plan._BFLOAT16) == (T.FLOAT, T.INT32, T.INT64, T.UINT32, T.UINT64,
                                                                 T.BFLOAT16)
    for mine, dtype in ((narrowing._I32, np.int32), (narrowing._I64, np.int64), (narrowing._U32, np.uint32),
                        (narrowing._U64, np.uint64)):
        assert (mine.min, mine.max) == (np.iinfo(dtype).min, np.iinfo(dtype).max)
    assert bf16_rounding._BF16_MAX == float(ml_dtypes.finfo(ml_dtypes.bfloat16).max)
