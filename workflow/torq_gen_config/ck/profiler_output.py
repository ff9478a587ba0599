"""Parsing what ckProfiler prints for a grouped convolution.

The format (profiler/include/profiler/profile_grouped_conv_*_impl.hpp; docs/ck_profile.md):
tensor descriptors, ``found N instances``, one ``Perf: <ms> ms, <x> TFlops, <y> GB/s,
<instance>[, SplitK <k>]`` line per instance that supports the problem, ``valids: N``
(in ANSI colour codes, fwd and bwd_weight), and a final block::

    Best configuration parameters:
    name: <instance>[ (instance <i>)]
    avg_time: <ms>
    tflops: <x>
    GB/s: <y>[, SplitK <k>]

The exit status reflects only verification: with verify=0 it is 0 even when no instance
ran, so :func:`judge` decides success from the output.
"""

from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass, field

_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
_NUM = r"[-+]?(?:\d+\.?\d*(?:[eE][-+]?\d+)?|\.\d+(?:[eE][-+]?\d+)?|inf|nan)"
_PERF = re.compile(rf"^Perf:\s*({_NUM})\s*ms,\s*({_NUM})\s*TFlops,\s*({_NUM})\s*GB/s,\s*(.*?)\s*$", re.IGNORECASE)
_SPLITK = re.compile(r",\s*SplitK\s+(\S.*?)\s*$")  # "16" or "16 (best occupancy)"
_VALIDS = re.compile(r"\bvalids:\s*(\d+)")
_FOUND = re.compile(r"\bfound\s+(\d+)\s+instances\b")
_BEST_HEADER = "Best configuration parameters"
_INSTANCE = re.compile(r"^(.*?)\s*\(instance\s+(\d+)\)\s*$")


def strip_ansi(text: str) -> str:
    """``text`` without ANSI escape sequences (colour codes)."""
    return _ANSI.sub("", text)


@dataclass
class Instance:
    """One ``Perf:`` line: ``ms`` (average per run), ``tflops``, ``gb_per_s`` (None where CK
    printed no finite number), the instance type string ``name``, and ``split_k`` (bwd ops)."""

    ms: float | None
    tflops: float | None
    gb_per_s: float | None
    name: str
    split_k: str | None = None


@dataclass
class Best:
    """The ``Best configuration parameters`` block (``instance_index``: bwd_weight only)."""

    name: str
    avg_time_ms: float | None
    tflops: float | None
    gb_per_s: float | None
    split_k: str | None = None
    instance_index: int | None = None


@dataclass
class ProfilerOutput:
    """Everything parsed from one run's stdout."""

    instances: list[Instance] = field(default_factory=list)
    valids: int | None = None
    found: int | None = None
    unsupported: int = 0
    best: Best | None = None

    def to_dict(self) -> dict:
        """JSON-ready form (the best block under ``best``, every Perf line under ``instances``)."""
        return asdict(self)


def _float(text: str) -> float | None:
    """The number, or None when it is not one or not finite (CK prints ``inf`` TFLOPS for 0 ms)."""
    try:
        v = float(text)
    except ValueError:
        return None
    return v if math.isfinite(v) else None


def _split_k(text: str) -> tuple[str, str | None]:
    m = _SPLITK.search(text)
    return (text[:m.start()].rstrip(), m.group(1)) if m else (text, None)


def parse(stdout: str) -> ProfilerOutput:
    """Parse a ckProfiler grouped-convolution run's stdout (ANSI codes are stripped first)."""
    out = ProfilerOutput()
    lines = strip_ansi(stdout).splitlines()
    best_at = None
    for i, raw in enumerate(lines):
        line = raw.strip()
        m = _PERF.match(line)
        if m:
            name, sk = _split_k(m.group(4))
            out.instances.append(Instance(ms=_float(m.group(1)), tflops=_float(m.group(2)),
                                          gb_per_s=_float(m.group(3)), name=name, split_k=sk))
            continue
        if line.endswith("does not support this problem"):
            out.unsupported += 1
        m = _VALIDS.search(line)
        if m:
            out.valids = int(m.group(1))
        m = _FOUND.search(line)
        if m and out.found is None:
            out.found = int(m.group(1))
        if line.startswith(_BEST_HEADER):
            best_at = i
    if best_at is not None:
        fields = {}
        for raw in lines[best_at + 1:best_at + 8]:
            key, sep, value = raw.strip().partition(":")
            if not sep:
                continue
            key = key.strip().lower()
            if key in fields or key not in ("name", "avg_time", "tflops", "gb/s"):
                continue
            fields[key] = value.strip()
        name = fields.get("name", "")
        index = None
        m = _INSTANCE.match(name)
        if m:
            name, index = m.group(1), int(m.group(2))
        gbs, sk = _split_k(fields.get("gb/s", ""))
        out.best = Best(name=name, avg_time_ms=_float(fields.get("avg_time", "")), tflops=_float(fields.get("tflops", "")),
                        gb_per_s=_float(gbs), split_k=sk, instance_index=index)
    return out


def judge(parsed: ProfilerOutput) -> str | None:
    """Why a run that exited 0 still failed, or None when it produced a real measurement:
    ``valids: 0``, no best block, or a best block without a name or with no positive time."""
    if parsed.valids == 0:
        return "valids: 0 (no CK instance supports this problem)"
    if parsed.best is None:
        return "no 'Best configuration parameters' block in the output"
    b = parsed.best
    if not b.name or b.avg_time_ms is None or not (b.avg_time_ms > 0):
        if not parsed.instances:
            return "no CK instance supports this problem (no Perf line, an empty best block)"
        return f"the best block names no measured instance (name {b.name!r}, avg_time {b.avg_time_ms}; time=0?)"
    return None


def tail_with_best(stdout: str, limit: int = 4000) -> str:
    """At most ``limit`` characters of ``stdout`` (ANSI codes stripped) for the results JSON:
    the whole text when short, else its end, which always holds the best block (the block
    alone when it is longer than ``limit``)."""
    text = strip_ansi(stdout)
    if len(text) <= limit:
        return text
    at = text.rfind(_BEST_HEADER)
    marker = "[... {} characters before, see the log ...]\n"
    start = len(text) - limit + len(marker.format(len(text)))
    if at != -1 and at < start:
        start = at
    return marker.format(start) + text[start:]
