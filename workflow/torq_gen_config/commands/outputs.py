"""The outputs of a run, named as the workflow's run context names them: the report name
and work directory of a config (the full model or a subgraph), the subgraph options that
make them again, and the weight archives a run needs that are missing."""

from __future__ import annotations

from pathlib import Path

from ..core.layout import LAYERS_DIR, MANIFEST_FILE, PREPARED_MODEL_FILE
from ..core.weight_store import FOLDED_FILE, STORE_FILE
from ..model.subgraph import run_names


def output_layout(config: dict) -> dict:
    """Names of the outputs of a (validated) config, as the workflow's run context makes them
    (:func:`torq_gen_config.model.subgraph.run_names`).

    Returns:
        ``{"name": <model>[_subgraph_<f>_<t>], "work": its work directory
        (``work/<name>``, relative to the output directory), "subgraph": the resolved
        range or None}``.

    Raises:
        ConfigError: a subgraph name is unknown (the message lists near matches), the
            range is reversed, or only one end is given.
    """
    names = run_names(config)
    return {"name": names.name, "work": names.work, "subgraph": names.subgraph}


def subgraph_flags(layout: dict) -> str:
    """The ``--subgraph-from/--subgraph-to`` options of a layout, for messages ("" without)."""
    sub = layout.get("subgraph")
    if not sub:
        return ""
    return f" --subgraph-from={sub['from']['name']} --subgraph-to={sub['to']['name']}"


def repair_rules(work: Path) -> dict[str, str]:
    """The weight archives of the work directory ``work`` that are missing while the
    models that refer to them are there (removed by hand), each with the rule that makes
    it: Snakemake would not make them again (an existing output over a missing
    intermediate is up to date to it), so the caller forces that rule."""
    found = {}
    if (work / PREPARED_MODEL_FILE).is_file() and not (work / STORE_FILE).is_file():
        found[STORE_FILE] = "prepare_model"
    if (work / LAYERS_DIR / MANIFEST_FILE).is_file() and not (work / FOLDED_FILE).is_file():
        found[FOLDED_FILE] = "split_layers"
    return found
