"""The whole-model hooks of a backend: compile and run the whole model at once.

A backend whose compiler has a per-op assignment pass (TORQ's
``--torq-executor-map``) does not need the model cut into a chain of partitions for
``torq-gen-config run``; its :meth:`~torq_gen_config.backends.base.Backend.whole_model`
returns a :class:`WholeModel`. This module imports no heavy dependency.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, Mapping, Sequence

__all__ = ["WholeModel"]


class WholeModel(ABC):
    """How a backend runs a whole model in one compile (``torq-gen-config run``), for a
    backend whose compiler has a per-op assignment pass (see
    :meth:`Backend.whole_model`). The full-model run (``torq_gen_config.fullrun``)
    does what is common (files, result skeleton, comparison); these hooks do the
    backend's part. A plan's ``mode`` is the backend kind.

    Attributes:
        kind: the backend kind.
        how: how its assignments run, for messages ("compiled as one whole model by ...").
    """

    kind: str = ""
    how: str = ""

    @abstractmethod
    def plan(self, model, manifest: Mapping, locations: Mapping | None, assignment: Mapping, executors: list[dict],
             partitions_dir: str, *, compiler_options: Sequence[str] = (), runtime_options: Sequence[str] = (),
             full_mlir: str | None = None) -> tuple[dict, dict[str, bytes]]:
        """The plan body (everything but ``schema``; ``mode`` = :attr:`kind`, one
        partition whose ``executor_def`` passes :meth:`is_whole_model`) and the files
        to write (path -> bytes) under ``partitions_dir/<pid>/``.

        Raises:
            ConfigError: an unknown executor, or executors whose options conflict.
        """

    @abstractmethod
    def is_whole_model(self, executor: Mapping) -> bool:
        """Whether a partition's executor definition is the whole-model one of a plan."""

    @abstractmethod
    def compile(self, executor: Mapping, *, model_path: str, work_dir: str, timeout_s: float,
                log_path: str | None) -> dict:
        """Compile the whole model: ``{"compile_ms", "artifact": {"path", "info"}, "tool"}``.

        Raises:
            StageError: the import, compile, a timeout or a crash failed.
        """

    @abstractmethod
    def run(self, partition: Mapping, compiled: Mapping, *, inputs: Mapping[str, Any], partition_dir: str,
            timeout_s: float, log_path: str | None) -> tuple[dict[str, Any], float]:
        """Run the compiled whole model once: ``(outputs by name, run_ms)``.

        Raises:
            StageError: the run failed; other exceptions are turned into run errors.
        """

    def result_fields(self, plan: Mapping, compiled: Mapping) -> dict:
        """Extra fields of the run's result (e.g. ``{"torq": {...}}``)."""
        return {}

    def failure_where(self, partition: Mapping) -> str:
        """Where a failure happened, the start of its summary."""
        return f"whole model on {self.kind}"

    def text_lines(self, section: Mapping) -> list[str]:
        """The lines of the report text that say how the model ran (before the timing line)."""
        return []

    def side_files(self, section: Mapping) -> list[tuple[str, str]]:
        """Files of the run worth naming on the console after ``run``: ``(label, path
        relative to the output directory)`` pairs (none by default)."""
        return []

    def summary(self, plan: Mapping) -> str:
        """One line on a plan of this mode, for the plan job's log."""
        return f"whole model on {self.kind}; {len(plan.get('fallbacks') or [])} layer(s) without a recommendation"
