"""Progress of a conformance run: on a terminal a live bar (rich) with the outcomes so far,
tests that did not pass printed above it; otherwise one line per test on stdout and a
``progress: N of M tests`` line on the stream at each tenth (at least 5 s, at most 30 s apart)."""

from __future__ import annotations

import collections
import sys
import time

from ..core.lazy import rich_console, rich_progress
from .evaluate import NOT_JUDGED, PASSED


def _hms(seconds: float) -> str:
    s = int(seconds)
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60}:{s % 60:02d}"


def outcome_label(r: dict) -> str:
    """``passed``, ``differing``, the stage of a failure (``compile``), or ``not judged (no layer)``."""
    if r["outcome"] == NOT_JUDGED:
        return f"{NOT_JUDGED} ({r.get('stage')})"
    return r["outcome"] if r["outcome"] == PASSED or not r.get("stage") else r["stage"]


def test_line(rec: dict) -> str:
    """``test_relu [Relu]: llvm-cpu passed, ort compile (2.1 s)``."""
    parts = [f"{name} {outcome_label(r)}" for name, r in rec["executors"].items()]
    return f"{rec['test']} [{rec['op_type']}]: {', '.join(parts) or 'no executor'} ({rec['seconds']:.1f} s)"


class TestProgress:
    """Context manager fed with each finished test's record (:meth:`done`)."""

    def __init__(self, total: int, current: int, *, quiet: bool = False, stream=None):
        self.total, self.current, self.quiet = total, current, quiet
        self.stream = stream or sys.stderr
        self.finished = 0
        self.outcomes: collections.Counter = collections.Counter()
        self.t0 = time.monotonic()
        self._last_line = self.t0
        self._next_tenth = 1
        self._live = None
        self._task = None

    def __enter__(self) -> "TestProgress":
        print(f"conformance: {self.current} test(s) current (not run again), {self.total} to run",
              file=self.stream, flush=True)
        if self.total and not self.quiet and self.stream.isatty():
            rp = rich_progress
            self._live = rp.Progress(rp.TextColumn("conformance"), rp.BarColumn(), rp.MofNCompleteColumn(),
                                     rp.TimeElapsedColumn(), rp.TextColumn("~"), rp.TimeRemainingColumn(),
                                     rp.TextColumn("{task.description}"),
                                     console=rich_console.Console(file=self.stream), transient=True)
            self._live.start()
            self._task = self._live.add_task("", total=self.total)
        return self

    def counts_text(self) -> str:
        """The outcomes so far, counted per (test, executor): ``(test x executor) passed 10, compile 2``."""
        return "(test x executor) " + (", ".join(f"{k} {v}" for k, v in self.outcomes.most_common()) or "-")

    def done(self, rec: dict) -> None:
        """One test finished."""
        self.finished += 1
        for r in rec["executors"].values():
            self.outcomes[outcome_label(r)] += 1
        if self._live is not None:
            if any(r["outcome"] != PASSED for r in rec["executors"].values()):
                self._live.console.print(test_line(rec), markup=False, highlight=False)
            self._live.update(self._task, advance=1, description=self.counts_text())
            return
        if not self.quiet:
            print(test_line(rec), flush=True)
        now = time.monotonic()
        tenth = self.finished * 10 // max(1, self.total)
        if self.finished == self.total or (tenth >= self._next_tenth and now - self._last_line >= 5) \
                or now - self._last_line >= 30:
            self._next_tenth = tenth + 1
            self._last_line = now
            el = now - self.t0
            left = el / self.finished * (self.total - self.finished)
            print(f"progress: {self.finished} of {self.total} tests ({100 * self.finished // max(1, self.total)}%); "
                  f"{self.counts_text()}; {_hms(el)} elapsed, ~{_hms(left)} left", file=self.stream, flush=True)

    def __exit__(self, *exc) -> None:
        if self._live is not None:
            self._live.stop()
        if self.total:
            print(f"conformance: {self.finished} of {self.total} tests run in {_hms(time.monotonic() - self.t0)}; "
                  f"{self.counts_text()}", file=self.stream, flush=True)
