"""The search of ``run --reduce`` (bisect, ends, single nodes) on failure predicates
whose smallest failing sets are known, the budget, and ``--reduce-budget`` parsing."""

from __future__ import annotations

import threading
import time

import pytest

from torq_gen_config.core.errors import ConfigError
from torq_gen_config.fullrun.reduce.search import Budget, Outcome, Reducer, _Stop, outcome_of, parse_budget

COMPILE_ERROR = Outcome("error", "compile", "llvm-cpu", "compile failed")


class PredicateReducer(Reducer):
    """The real search with candidates judged by a predicate instead of compiled (each
    candidate counts as one compile for the budget)."""

    def __init__(self, n: int, fails, *, jobs: int = 1, budget: Budget = Budget(), outcome: Outcome = COMPILE_ERROR):
        self.nodes = list(range(n))
        self.fails = fails
        self.jobs = jobs
        self.budget = budget
        self.outcome = outcome
        self.started = time.monotonic()
        self.exhausted = None
        self.compiles = self.evaluated = self.cached = 0
        self.progress = lambda line: None
        self._lock = threading.Lock()
        self.seen: dict[tuple, Outcome] = {}

    def evaluate(self, nodes):
        key = tuple(nodes)
        if key in self.seen:
            return self.seen[key]
        self._spend()
        with self._lock:
            self.compiles += 1
            self.evaluated += 1
        out = self.outcome if self.fails(set(nodes)) else Outcome("success")
        self.seen[key] = out
        return out

    @property
    def model(self):  # the search names dropped nodes by op type
        class _N:
            op_type = "Op"

        class _G:
            node = [_N()] * 10_000

        class _M:
            graph = _G()
        return _M()


@pytest.mark.parametrize("jobs", [1, 3])
def test_two_far_apart_nodes_are_found_and_nothing_else(jobs):
    r = PredicateReducer(100, lambda s: {17, 64} <= s, jobs=jobs)
    found = r.search(COMPILE_ERROR)
    assert found["nodes"] == [17, 64]
    assert found["reproduced"] and found["minimal"]


def test_bisect_narrows_a_failure_inside_one_half():
    r = PredicateReducer(64, lambda s: {40, 41, 42} <= s)
    found = r.search(COMPILE_ERROR)
    assert found["nodes"] == [40, 41, 42] and found["minimal"]
    assert any(step.startswith("bisect: kept the second half") for step in found["steps"])


def test_a_single_failing_node():
    r = PredicateReducer(30, lambda s: 29 in s)
    assert r.search(COMPILE_ERROR)["nodes"] == [29]


def test_a_failure_that_needs_any_two_of_a_kind_keeps_exactly_two():
    convs = {3, 9, 15, 21, 27}
    r = PredicateReducer(30, lambda s: len(s & convs) >= 2, jobs=2)
    found = r.search(COMPILE_ERROR)
    assert len(found["nodes"]) == 2 and set(found["nodes"]) <= convs and found["minimal"]


def test_a_failure_of_another_kind_does_not_count():
    # every candidate without node 5 fails too, but at another stage: not "the same way"
    other = Outcome("error", "run", "llvm-cpu", "run failed")

    class Mixed(PredicateReducer):
        def evaluate(self, nodes):
            out = super().evaluate(nodes)
            return out if 5 in nodes else (other if len(nodes) > 1 else Outcome("success"))

    r = Mixed(20, lambda s: {5, 6} <= s)
    assert r.search(COMPILE_ERROR)["nodes"] == [5, 6]


def test_not_reproduced_when_the_whole_set_does_not_fail_so():
    r = PredicateReducer(10, lambda s: False)
    found = r.search(COMPILE_ERROR)
    assert not found["reproduced"] and found["nodes"] == list(range(10))
    assert "does not fail the same way" in found["steps"][0]


def test_nothing_smaller_fails_keeps_the_whole_set():
    r = PredicateReducer(6, lambda s: len(s) == 6)
    found = r.search(COMPILE_ERROR)
    assert found["reproduced"] and found["nodes"] == list(range(6)) and found["minimal"]


def test_the_compile_budget_stops_the_search_and_says_so():
    r = PredicateReducer(200, lambda s: {17, 164} <= s, budget=Budget(compiles=5))
    found = r.search(COMPILE_ERROR)
    assert r.compiles == 5 and not found["minimal"]
    assert "compile budget (5 compiles) is spent" in r.exhausted
    assert {17, 164} <= set(found["nodes"])  # what it keeps still fails


def test_a_spent_budget_raises_stop_before_a_new_candidate():
    r = PredicateReducer(10, lambda s: True, budget=Budget(seconds=0.0001))
    time.sleep(0.01)
    with pytest.raises(_Stop):
        r._spend()


def test_a_difference_matches_any_difference():
    diff = Outcome("difference", summary="max rel diff 1.0")
    assert Outcome("difference", summary="other numbers").same_failure(diff)
    assert not Outcome("error", "compile", "x").same_failure(diff)
    assert not Outcome("error", "compile", "vmvx").same_failure(COMPILE_ERROR)  # another executor
    assert not Outcome("success").same_failure(Outcome("success"))  # a success is nothing to reduce


def test_outcome_of_a_result():
    res = {"status": "error", "summary": "s", "failure": {"stage": "compile", "executor": "vmvx", "summary": "f"}}
    assert outcome_of(res) == Outcome("error", "compile", "vmvx", "f")
    assert outcome_of({"status": "difference", "summary": "d"}) == Outcome("difference", summary="d")


@pytest.mark.parametrize("text,budget", [
    (None, Budget()), ("", Budget()), ("600", Budget(600.0)), ("90s", Budget(90.0)), ("10m", Budget(600.0)),
    ("1h", Budget(3600.0)), ("40c", Budget(None, 40)), ("12compiles", Budget(None, 12)),
    ("10m,40c", Budget(600.0, 40)), ("40c, 2m", Budget(120.0, 40)), ("1h30m", Budget(5400.0)), ("2m30.5s", Budget(150.5)),
])
def test_parse_budget(text, budget):
    assert parse_budget(text) == budget


@pytest.mark.parametrize("text", ["0", "abc", "10x", "-5", "5c,foo", "10m,5m", "3c,2c", "0c", "1e3", "inf", "30m1h1h", "m"])
def test_parse_budget_refuses_with_one_line(text):
    with pytest.raises(ConfigError, match="--reduce-budget"):
        parse_budget(text)
