"""End to end: the faults that need a whole run (a hanging reference, Ctrl-C and kill -9
with the resumed run, the two forms on one output directory, a raised --timeout), each
run through the real console script by benchmarks/faults.py's scenario of that kind.

A row passes when it is "clear" there: the expected exit status and verdicts, no
traceback, nothing corrupt or temporary left, no finished verdict lost on resume, no run
over its time bound, no process left behind.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]


def _faults():
    spec = importlib.util.spec_from_file_location("tgc_faults_benchmark", REPO / "benchmarks" / "faults.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look the module up by name
    spec.loader.exec_module(module)
    return module


faults = _faults()

KINDS = [
    "hanging reference (Loop 2**40)",
    "hanging compiler",
    "Ctrl-C mid-run",
    "kill -9 mid-run",
    "kill -9, wrapper-script compiler",
    "SIGTERM mid-run",
    "concurrent: CLI, then Snakemake form",
    "timeout raised 5 -> 60 s",
    "stale report after a stopped rerun",
]


@pytest.mark.parametrize("name", KINDS)
def test_fault_is_handled_clearly(name, tmp_path):
    if not Path(faults.TGC).exists():
        pytest.skip(f"the console script is not installed next to this Python ({faults.TGC})")
    outcome = faults.run_kind(faults.KINDS_BY_NAME[name], tmp_path)
    if outcome.not_measured:
        pytest.skip(f"not measurable here: {outcome.not_measured}")
    details = "\n".join(outcome.problems + [f"corrupt: {c}" for c in outcome.corrupt]
                        + [f"left: {s}" for s in outcome.stale])
    assert outcome.clear, f"{name}: exit {outcome.exit}, {outcome.message}\n{details}"
    assert outcome.tracebacks == 0, details
    assert outcome.over_time == 0, f"{outcome.wall:.1f} s against a bound of {outcome.bound:.0f} s"
    assert outcome.leftovers == 0, details
    assert not outcome.lost, f"{outcome.lost} finished verdicts lost on resume"
