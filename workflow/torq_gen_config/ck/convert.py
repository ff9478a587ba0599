"""A PyTorch trace -> CK Profiler configurations (``ck_profiler_configs.json``).

One configuration per CK operation a record computes: a forward record gives
``grouped_conv_fwd``; a ``convolution_backward`` gives ``grouped_conv_bwd_data`` and/or
``grouped_conv_bwd_weight`` as its output_mask asks. Data type and layout come from the
trace (profiler_args has the codes), K and C are per group, pads stay left/right.
Records are converted in trace order; ``--max-ops`` later picks by priority rank.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from ..core.errors import TorqGenConfigError
from ..core.fileio import write_json
from . import profiler_args as pa
from .trace_ir import ConvRecord, RecordSkipped, is_convolution, parse_record, read_trace

_PASS_OPS = {"forward": pa.FWD, "backward_data": pa.BWD_DATA, "backward_weight": pa.BWD_WEIGHT}
_TITLES = {pa.FWD: "Forward conv", pa.BWD_DATA: "Backward data conv", pa.BWD_WEIGHT: "Backward weight conv"}


@dataclass
class Conversion:
    """What a conversion produced.

    Attributes:
        configs: the configurations, in trace order.
        records: number of records in the trace.
        per_op: configurations per CK op short name (fwd, bwd_data, bwd_weight).
        skipped: ``(record index, op_name, what, reason)`` for convolution work not converted.
        not_convolutions: op_name -> count of records that are not convolutions (warnings).
        notes: ``(record index, note)`` remarks on converted records (1D layouts, missing ranks).
        lines: one console line per record, in trace order.
    """

    configs: list[dict] = field(default_factory=list)
    records: int = 0
    per_op: Counter = field(default_factory=Counter)
    skipped: list[tuple[int, str, str, str]] = field(default_factory=list)
    not_convolutions: Counter = field(default_factory=Counter)
    notes: list[tuple[int, str]] = field(default_factory=list)
    lines: list[str] = field(default_factory=list)


def describe(op: str, problem) -> str:
    """The seed's description text (plus the data type), e.g. ``Forward conv: G=32, N=32,
    K=4, C=4, [3, 3] kernel, [200, 200] input, fp16``."""
    return (f"{_TITLES[op]}: G={problem.G}, N={problem.N}, K={problem.K}, C={problem.C}, "
            f"{list(problem.filter)} kernel, {list(problem.input)} input, {problem.dtype}")


def _configs_of(rec: ConvRecord, conv: Conversion) -> list[dict]:
    """The configurations of one validated record (a pass CK cannot run is skipped)."""
    p = rec.problem
    out = []
    for what in rec.passes:
        op = _PASS_OPS[what]
        notes = list(rec.notes)
        try:
            layout = pa.layout_name(p)
        except pa.ConfigFormatError as e:
            conv.skipped.append((rec.index, rec.op_name, pa.SHORT[op], str(e)))
            continue
        if p.ndim == 1:
            if op == pa.BWD_DATA:
                conv.skipped.append((rec.index, rec.op_name, "bwd_data", "CK's grouped_conv_bwd_data has no 1D instances"))
                continue
            # CK has no NGCW layouts, and its 1D bwd_weight dispatches GNWC only: the same
            # convolution in the memory layout CK has (profile_grouped_conv_*.cpp)
            want = "GNWC_GKXC_GNWK" if op == pa.BWD_WEIGHT else "NWGC_GKXC_NWGK"
            if layout != want:
                notes.append(f"CK has no {layout} {pa.SHORT[op]} for 1D: profiled as {want} (the same convolution, "
                             "another memory layout)")
                layout = want
        if op == pa.BWD_DATA and p.ndim == 3 and layout.startswith("NGC"):
            notes.append("CK's bwd_data 3D layout-3 branch repeats the layout-2 test upstream: "
                         "builds with that bug report 'not implemented'")
        if rec.priority_rank is None:
            notes.append("no metadata.priority_rank in the trace: ranked after the ranked records")
        meta = {"priority_rank": rec.priority_rank, "pytorch_op": rec.op_name, "description": describe(op, p),
                "dtype": p.dtype, "layout_name": layout, "trace_record": rec.index}
        if rec.count is not None:
            meta["count"] = rec.count
        if notes:
            meta["notes"] = notes
            conv.notes.extend((rec.index, n) for n in notes)
        try:  # the runner's own checks: what is written here runs there
            cfg = pa.make_config(p, op, layout=layout, metadata=meta)
            pa.normalize_config(cfg)
            out.append(cfg)
        except pa.ConfigFormatError as e:
            conv.skipped.append((rec.index, rec.op_name, pa.SHORT[op], str(e).removeprefix("configuration: ")))
    return out


def convert_records(records: list) -> Conversion:
    """Convert the records of a trace (as :func:`trace_ir.read_trace` returns them).

    Never raises for a bad record: a malformed or unprofilable convolution is listed in
    ``skipped`` with its reason, a record of another op in ``not_convolutions``.
    """
    conv = Conversion(records=len(records))
    total = len(records)
    for i, record in enumerate(records):
        op_name = record["op_name"]
        if not is_convolution(record):
            conv.not_convolutions[op_name] += 1
            conv.lines.append(f"⚠ [{i + 1}/{total}] Not a convolution: {op_name} (ignored)")
            continue
        rank = (record.get("metadata") or {}).get("priority_rank") if isinstance(record.get("metadata"), dict) else None
        try:
            rec = parse_record(record, i)
        except RecordSkipped as e:
            conv.skipped.append((i, op_name, "record", str(e)))
            conv.lines.append(f"⚠ [{i + 1}/{total}] Skipped: {op_name} (rank {rank}): {e}")
            continue
        before = len(conv.skipped)
        for c in _configs_of(rec, conv):
            conv.configs.append(c)
            conv.per_op[pa.SHORT[c["operation_type"]]] += 1
            conv.lines.append(f"✓ [{i + 1}/{total}] Converted: {op_name} (rank {rank}) → {pa.SHORT[c['operation_type']]}")
        for _, _, what, reason in conv.skipped[before:]:
            conv.lines.append(f"⚠ [{i + 1}/{total}] Skipped {what}: {op_name} (rank {rank}): {reason}")
    return conv


def convert_file(trace_path: str | Path, output_path: str | Path | None) -> Conversion:
    """Read a trace, convert it and write the configurations (atomically) unless
    ``output_path`` is None or nothing was converted (an earlier file is not replaced by an
    empty list).

    Raises:
        TraceFormatError: the trace cannot be read (one line).
        TorqGenConfigError: the output cannot be written (one line naming it).
    """
    conv = convert_records(read_trace(trace_path))
    if output_path is not None and conv.configs:
        try:
            write_json(output_path, conv.configs)
        except OSError as e:
            raise TorqGenConfigError(f"cannot write {output_path}: {e.strerror or e}") from None
    return conv


def summary_text(conv: Conversion, output: str | None) -> str:
    """The seed's conversion summary, with the skip reasons and the ignored ops."""
    bar = "=" * 60
    # a record counts as skipped when none of its passes became a configuration
    converted = {c["metadata"]["trace_record"] for c in conv.configs}
    skipped_records = {i for i, _, _, _ in conv.skipped if i not in converted}
    skipped_passes = sum(1 for i, _, what, _ in conv.skipped if what != "record" and i in converted)
    lines = ["", bar, "Conversion Summary", bar,
             f"Total PyTorch operations:     {conv.records}",
             f"  ✓ Forward convolutions:       {conv.per_op['fwd']}",
             f"  ✓ Backward data convolutions: {conv.per_op['bwd_data']}",
             f"  ✓ Backward weight convolutions: {conv.per_op['bwd_weight']}",
             f"  ⚠ Skipped operations:         {len(skipped_records)}"
             + (f" (+{skipped_passes} passes of converted records)" if skipped_passes else ""),
             f"  ⚠ Not convolutions (ignored): {sum(conv.not_convolutions.values())}"]
    reasons = Counter(reason for _, _, _, reason in conv.skipped)
    for reason, n in reasons.most_common():
        lines.append(f"      {n} × {reason}")
    for op, n in sorted(conv.not_convolutions.items()):
        lines.append(f"      {n} × {op}")
    note_counts = Counter(n for _, n in conv.notes)
    if note_counts:
        lines.append("  Notes:")
        lines += [f"      {n} × {note}" for note, n in note_counts.most_common()]
    lines += ["", f"Total CK profiler configs:    {len(conv.configs)}",
              f"Output file:                  {output if output and conv.configs else '(not written)'}", bar]
    return "\n".join(lines)
