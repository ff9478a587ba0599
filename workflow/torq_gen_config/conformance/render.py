"""The support matrix as Markdown and as one self-contained HTML page (no scripts, no
network): a row per op type, a cell per executor with passed / tests, coloured by share."""

from __future__ import annotations

import html

from .evaluate import DIFFERING, FAILED, NOT_JUDGED, PASSED
from .matrix import judged


def _by_count(tally: dict) -> list[tuple[str, int]]:
    return sorted(tally.items(), key=lambda kv: (-kv[1], kv[0]))


def not_judged_text(cell: dict) -> str:
    """``2 not judged: 1 no layer, 1 refused`` (empty when every test was judged)."""
    if not cell[NOT_JUDGED]:
        return ""
    return f"{cell[NOT_JUDGED]} not judged: " + ", ".join(f"{n} {r}" for r, n in _by_count(cell["not_judged_reasons"]))


def cell_text(cell: dict) -> str:
    """``3/4 (1 compile; 1 not judged: 1 no layer)``: passed of the judged tests, the
    differing and failing ones by stage, then the tests not judged by reason."""
    if not cell["tests"]:
        return "-"
    nj = not_judged_text(cell)
    if not judged(cell):
        return nj
    rest = ([f"{cell[DIFFERING]} differing"] if cell[DIFFERING] else []) + \
        [f"{n} {stage}" for stage, n in _by_count(cell["stages"])]
    inner = "; ".join(x for x in (", ".join(rest), nj) if x)
    return f"{cell[PASSED]}/{judged(cell)}" + (f" ({inner})" if inner else "")


def _opsets(row: dict) -> str:
    lo_hi = row.get("opsets")
    if not lo_hi:
        return "-"
    return str(lo_hi[0]) if lo_hi[0] == lo_hi[1] else f"{lo_hi[0]}-{lo_hi[1]}"


def _md(text) -> str:
    return str(text if text is not None else "").replace("|", "\\|").replace("\n", " ")


def summary_lines(doc: dict) -> list[str]:
    """One line per executor: passed / differing / failed of the judged tests, the failures by
    stage, and the tests not judged by reason."""
    lines = []
    for name, cell in doc["summary"]["executors"].items():
        n = judged(cell)
        stages = ", ".join(f"{s} {c}" for s, c in _by_count(cell["stages"]))
        nj = not_judged_text(cell)
        share = f"{100.0 * cell[PASSED] / n:.1f}%" if n else "n/a"
        lines.append(f"{name}: passed {cell[PASSED]} of {n} judged ({share}), "
                     f"differing {cell[DIFFERING]}, failed {cell[FAILED]}" + (f" ({stages})" if stages else "")
                     + (f"; {nj}" if nj else ""))
    return lines


def markdown(doc: dict) -> str:
    """The matrix document (``conformance.json``) as Markdown."""
    execs = doc["executors"]
    sel = doc["selection"]
    out = ["# ONNX node test conformance", "",
           f"{doc['summary']['tests']} node tests (onnx {doc['versions'].get('onnx')}; {sel['considered']} considered of "
           f"{sel['collected']} collected) on {', '.join(execs)}. A test passes on an executor when the executor's "
           "outputs match the test's expected outputs within its rtol/atol; it is not judged when they could not "
           "be had through no fault of the executor's (a node folded to a constant, a test the discovery refused, "
           "...); the product's verdicts (against its reference) are counted apart.", ""]
    out += [f"- {line}" for line in summary_lines(doc)]
    ref = doc["summary"]["reference"]
    out += [f"- reference vs expected: " + ", ".join(f"{k} {v}" for k, v in sorted(ref.items(), key=lambda kv: -kv[1])),
            "", "| op type | opsets | tests | " + " | ".join(execs) + " |",
            "|---|---|---|" + "---|" * len(execs)]
    for op, row in doc["ops"].items():
        out.append(f"| {_md(op)} | {_opsets(row)} | {row['tests']} | "
                   + " | ".join(_md(cell_text(row["executors"][e])) for e in execs) + " |")
    errors = [(op, e, row["executors"][e]["first_error"]) for op, row in doc["ops"].items() for e in execs
              if row["executors"][e]["first_error"]]
    if errors:
        out += ["", "## First error of each failing op type and executor", "",
                "| op type | executor | test | outcome | stage | message |", "|---|---|---|---|---|---|"]
        out += [f"| {_md(op)} | {e} | {fe['test']} | {fe['outcome']} | {_md(fe.get('stage') or '')} | "
                f"{_md((fe.get('message') or '')[:200])} |" for op, e, fe in errors]
    for comp in doc.get("expected_failures") or []:
        out += ["", f"## {comp['executor']} against {comp['file']}", "",
                f"{comp['listed']} tests listed ({comp['listed_not_run']} not run here); {comp['expected_failures']} "
                f"fail as listed; {len(comp['unexpected_passes'])} unexpected passes; "
                f"{len(comp['unexpected_failures'])} unexpected failures; {len(comp['stage_differs'])} fail at "
                f"another stage than listed; {len(comp['not_judged'])} not judged.", ""]
        out += [f"- unexpected pass: {e['test']} (listed as a {e['listed_as']} failure)"
                for e in comp["unexpected_passes"]]
        out += [f"- unexpected failure: {e['test']}: {e['outcome']}"
                + (f" ({e['stage']})" if e.get("stage") else "") + f": {_md((e.get('message') or '')[:160])}"
                for e in comp["unexpected_failures"]]
    return "\n".join(out) + "\n"


_STYLE = """body{font-family:sans-serif;margin:1.5em}table{border-collapse:collapse;font-size:13px}
td,th{border:1px solid #ccc;padding:3px 6px;text-align:left}th{background:#eee;position:sticky;top:0}
td.all{background:#c8e6c9}td.some{background:#fff3c4}td.none{background:#ffcdd2}td.na{color:#999}
.msg{font-family:monospace;font-size:12px}"""


def _cls(cell: dict) -> str:
    if not judged(cell):
        return "na"
    return "all" if cell[PASSED] == judged(cell) else "some" if cell[PASSED] else "none"


def html_page(doc: dict) -> str:
    """The matrix document as one self-contained HTML page; a cell's tooltip names its
    verdicts, failing tests and first error."""
    e = html.escape
    execs = doc["executors"]
    parts = ["<!DOCTYPE html><html><head><meta charset='utf-8'><title>ONNX node test conformance</title>",
             f"<style>{_STYLE}</style></head><body><h1>ONNX node test conformance</h1>",
             f"<p>{doc['summary']['tests']} node tests, onnx {e(str(doc['versions'].get('onnx')))}; "
             f"cells: tests passed (outputs within the test's rtol/atol) of the tests judged, then differing and "
             f"failing ones by stage, and the tests not judged (no fault of the executor's) by reason. Hover a cell "
             f"for the product's verdicts and the first error.</p><ul>"]
    parts += [f"<li>{e(line)}</li>" for line in summary_lines(doc)]
    parts.append("</ul><table><tr><th>op type</th><th>opsets</th><th>tests</th>"
                 + "".join(f"<th>{e(x)}</th>" for x in execs) + "</tr>")
    for op, row in doc["ops"].items():
        cells = []
        for x in execs:
            c = row["executors"][x]
            fe = c["first_error"]
            tip = "verdicts: " + ", ".join(f"{k} {v}" for k, v in c["verdicts"].items())
            if fe:
                tip += f"\nfailing: {', '.join(c['failing_tests'][:20])}\nfirst error ({fe['test']}): " \
                       f"{fe.get('stage') or fe['outcome']}: {fe.get('message') or ''}"
            if c["not_judged_tests"]:
                tip += f"\nnot judged: {', '.join(c['not_judged_tests'][:20])}"
            cells.append(f"<td class='{_cls(c)}' title='{e(tip)}'>{e(cell_text(c))}</td>")
        parts.append(f"<tr><td>{e(op)}</td><td>{_opsets(row)}</td><td>{row['tests']}</td>{''.join(cells)}</tr>")
    parts.append("</table>")
    errors = [(op, x, row["executors"][x]["first_error"]) for op, row in doc["ops"].items() for x in execs
              if row["executors"][x]["first_error"]]
    if errors:
        parts.append("<h2>First error of each failing op type and executor</h2><table><tr><th>op type</th>"
                     "<th>executor</th><th>test</th><th>stage</th><th>message</th></tr>")
        parts += [f"<tr><td>{e(op)}</td><td>{e(x)}</td><td>{e(fe['test'])}</td>"
                  f"<td>{e(fe.get('stage') or fe['outcome'])}</td><td class='msg'>{e(fe.get('message') or '')}</td></tr>"
                  for op, x, fe in errors]
        parts.append("</table>")
    for comp in doc.get("expected_failures") or []:
        parts.append(f"<h2>{e(comp['executor'])} against {e(comp['file'])}</h2><p>{comp['listed']} listed, "
                     f"{comp['expected_failures']} fail as listed, {len(comp['unexpected_passes'])} unexpected passes, "
                     f"{len(comp['unexpected_failures'])} unexpected failures, {len(comp['not_judged'])} not "
                     f"judged.</p><ul>")
        parts += [f"<li>unexpected pass: {e(x['test'])} (listed: {e(x['listed_as'])})</li>"
                  for x in comp["unexpected_passes"]]
        parts += [f"<li>unexpected failure: {e(x['test'])}: {e(x.get('stage') or x['outcome'])}: "
                  f"<span class='msg'>{e(x.get('message') or '')}</span></li>" for x in comp["unexpected_failures"]]
        parts.append("</ul>")
    return "".join(parts) + "</body></html>\n"
