"""Limits, in one place: the time limits of the in-process work, derived from the run's
``timeout_s``, and the lengths of the messages the results and reports keep.

``timeout_s`` (``--timeout``, default 300 s) bounds every tool call of a job. Work that
runs in a supervised worker (:mod:`torq_gen_config.core.isolation`) gets a limit that leaves
that call its own deadline first (an engine's timeout gives a clean message; the worker
limit is the backstop that also stops what cannot be interrupted).
"""

from __future__ import annotations

#: Time limit of a job's tool or engine call when the caller gives none (the config's
#: default ``timeout_s``), seconds.
DEFAULT_TIMEOUT_S = 300.0
#: Most seconds a worker gets beyond its call's own deadline (start-up, loading, writing).
GRACE_S = 30.0
#: Seconds a whole-model job gets beyond its bounded calls (loading, inference, folding, writing).
MODEL_GRACE_S = 60.0
#: Longest ``--version`` probe of a tool, seconds (also bounded by ``timeout_s``).
PROBE_S = 60.0
#: Characters of a verdict's one-line ``summary`` (failure reports, console lines).
SUMMARY_CHARS = 512
#: Characters of a verdict's full ``message`` (a tool's output, cut around its first error).
MESSAGE_CHARS = 4000
#: Characters of an engine's or library's error kept inside a message (a reference engine
#: failing on a layer, onnxruntime.quantization, an ONNX graph check).
DETAIL_CHARS = 2000
#: Characters of a cause quoted inside a one-line message or warning (a model that cannot
#: be read, a node that cannot be folded, a schema violation).
NOTE_CHARS = 300
#: the longest command line a message about a run in progress shows (core/run_lock.py;
#: a longer one ends in " ...")
COMMAND_CHARS = 160


def call_limit(timeout_s: float) -> float:
    """Limit of one bounded call in a worker (one reference engine on one layer, one
    ONNX Runtime session creation, run or benchmark, one MLIR import), seconds."""
    timeout_s = float(timeout_s)
    return timeout_s + min(GRACE_S, max(2.0, timeout_s))


def model_job_limit(timeout_s: float, calls: int = 3) -> float:
    """Limit of a whole-model job in a worker (preparation with its whole-model run,
    the split with the layer-input run, calibration, quantization, the partition plan),
    seconds: ``calls`` bounded calls plus loading and writing the model."""
    return float(timeout_s) * calls + MODEL_GRACE_S


def probe_limit(timeout_s: float) -> float:
    """Limit of one ``--version`` probe, seconds."""
    return min(float(timeout_s), PROBE_S)

#: Weights a compile batch may hold (bytes): the merged module's text holds them twice
#: over, a few times in the batch job's memory (about 6x: 3.3 GB for a batch of 256 MB of
#: weights, measured) and again in the compiler's; heavier layers compile alone, from their
#: own file. A layer of this size compiles for seconds: batching it saves little.
BATCH_WEIGHT_BYTES = 16 << 20
