"""The verdict vocabulary: every status a (layer, executor) verdict can have, the
statuses people see (``success*``, ``not tested``), their order, severity and colours, in
one place for the progress display, ``view``, the report text, the HTML report and the
model graph.

A stored verdict (``result.json``, the report's ``statuses``) is one of :data:`STATUSES`
(docs/comparison.md). What is shown adds two: ``success*``, a success whose comparison
could not have failed (:func:`torq_gen_config.compare.shown_status` decides it), and
``not tested``, an executor without an entry for the layer.
"""

from __future__ import annotations

from collections.abc import Iterable

SUCCESS, DIFFERENCE, ERROR, UNVERIFIED, SKIPPED = "success", "difference", "error", "unverified", "skipped"
#: a success whose comparison could not have failed (shown, never stored)
INCONCLUSIVE = "success*"
#: an executor with no entry for the layer (shown, never stored)
NOT_TESTED = "not tested"
#: the statuses of a stored verdict, in the order counts are listed
STATUSES = (SUCCESS, DIFFERENCE, ERROR, UNVERIFIED, SKIPPED)
#: the statuses shown, in the order of the HTML matrix's colour scale
DISPLAY_STATUSES = (SUCCESS, INCONCLUSIVE, DIFFERENCE, ERROR, UNVERIFIED, SKIPPED, NOT_TESTED)
#: from best to worst: a layer's colour in the model graph is its worst verdict's
SEVERITY = (SUCCESS, SKIPPED, NOT_TESTED, INCONCLUSIVE, UNVERIFIED, DIFFERENCE, ERROR)
#: colour of each shown status on a terminal (rich styles): caution (an inconclusive
#: success, a difference) is yellow in the progress display and in ``view`` alike
TERMINAL_STYLES = {SUCCESS: "green", INCONCLUSIVE: "yellow", DIFFERENCE: "yellow", ERROR: "bold red",
                   UNVERIFIED: "magenta", SKIPPED: "dim", NOT_TESTED: "dim"}
#: colour of each shown status in the HTML report (the terminal's hues; an inconclusive
#: success a pale green, between success and difference)
HTML_COLORS = {SUCCESS: "#2e7d32", INCONCLUSIVE: "#aed581", DIFFERENCE: "#f9a825", ERROR: "#c62828",
               UNVERIFIED: "#8e24aa", SKIPPED: "#90a4ae", NOT_TESTED: "#eceff1"}
#: text colour on each status's HTML colour (dark on the pale ones)
HTML_TEXT_COLORS = {s: ("#212121" if s in (INCONCLUSIVE, NOT_TESTED, DIFFERENCE) else "#fff") for s in DISPLAY_STATUSES}


def worst(statuses: Iterable[str]) -> str:
    """The worst shown status of ``statuses`` (:data:`SEVERITY`; an unknown one counts as
    worst); ``not tested`` for none."""
    rank = {s: i for i, s in enumerate(SEVERITY)}
    return max(statuses, key=lambda s: rank.get(s, len(SEVERITY)), default=NOT_TESTED)
