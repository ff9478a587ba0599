"""What the steps of the full-model run share: file schemas and names, the rules
``torq-gen-config run`` runs, and two small formatters."""

from __future__ import annotations

ASSIGNMENT_SCHEMA = "torq-gen-config/full-model-assignment/1"
PLAN_SCHEMA = "torq-gen-config/full-model-plan/1"
COMPILED_SCHEMA = "torq-gen-config/full-model-compiled/1"
RESULT_SCHEMA = "torq-gen-config/full-model-result/1"

#: Rules ``torq-gen-config run`` lets Snakemake execute (never discovery or the report;
#: the model preparation and split only when they are missing or out of date).
RUN_RULES = ("prepare_model", "import_full_model", "split_layers", "plan_full_model", "compile_partition_batch",
             "compile_partition", "full_reference", "run_full_model")
#: Mode of a plan that runs the model as a chain of partitions (a whole-model plan's
#: mode is its backend's kind).
PARTITIONS_MODE = "partitions"
#: the run mode of one IREE module with per-op devices (module/mode.py)
MODULE_MODE = "module"
#: the status of a one-module run whose outputs match the reference while some layer ran
#: on another device than assigned (the read-back): not the program the user asked about
NOT_AS_ASSIGNED = "success, not as assigned"
#: what a read-back flag means, in the text report and the HTML alike
TWO_BACKENDS_NOTE = "IREE's shared-executable bug: its numbers may be wrong"
ELSEWHERE_NOTE = ("read back from the compiled program: every dispatch is pinned to its device, yet the program is "
                  "what ran, not the assignment")


def _layer_span(layer_ids: list[str]) -> str:
    if not layer_ids:
        return "-"
    if len(layer_ids) == 1:
        return layer_ids[0]
    return f"{layer_ids[0]} .. {layer_ids[-1]} ({len(layer_ids)})"


def _round(x: float | None) -> float | None:
    return None if x is None else round(float(x), 3)


def not_as_assigned_summary(placement: dict | None) -> str | None:
    """The summary (after its status, :data:`NOT_AS_ASSIGNED`) of a module result whose
    outputs match while layers ran elsewhere than assigned (``placement``: :func:`~.module.run.layer_placement`'s record): the count and
    the first three layers; None when every layer with a kernel ran as assigned."""
    pl = placement or {}
    away = list(pl.get("elsewhere") or [])
    if not away:
        return None
    rows = pl.get("layers") or {}
    first = "; ".join(f"{lid} (assigned {(rows.get(lid) or {}).get('assigned')}, ran on "
                      f"{', '.join((rows.get(lid) or {}).get('ran_on') or [])})" for lid in away[:3])
    return (f"the outputs match, but {len(away)} of {len(rows)} layer(s) ran elsewhere than assigned: {first}"
            + (f" and {len(away) - 3} more" if len(away) > 3 else ""))
