"""The files of one discovery in its output directory: one place for their names.

Everything a run writes is keyed by the report name (the model's file stem, plus
``_subgraph_<f>_<t>`` in subgraph mode), so that several models, and the subgraphs of
one model, can share an output directory without touching each other's files::

    <output dir>/torq_gen_config_<name>.json            report JSON
    <output dir>/torq_gen_config_<name>_compiler.json   compiler JSON
    <output dir>/torq_gen_config_<name>.html            HTML report (`torq-gen-config report`, rule report_html)
    <output dir>/work/<name>/                           everything else (layers, logs, full, ...)
    <output dir>/.torq-gen-config-<name>.lock           held while a run of <name> runs
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

#: Folder of the per-name work directories, relative to the output directory.
WORK_ROOT = "work"
#: File in a work directory that exists while the report is older than the work files
#: (a job that feeds the report ran after it was written; removed when it is written).
OUTDATED_MARKER = ".report-outdated"
REPORT_PREFIX = "torq_gen_config_"
#: Folders of a work directory: the layers (one folder per layer slug, then one per
#: executor), the job logs, the quantized model, the full-model run.
LAYERS_DIR, LOGS_DIR, QUANT_DIR, FULL_DIR = "layers", "logs", "quant", "full"
#: Files of a work directory: the prepared model with its preparation record and the
#: model's input values, its MLIR and node -> line:col map, the split's layer manifest
#: (in LAYERS_DIR; with quantize also in QUANT_DIR), the report's summary; with quantize
#: (in QUANT_DIR) the calibration ranges, the quantized model and its record.
PREPARED_MODEL_FILE, PREPARE_INFO_FILE, MODEL_INPUTS_FILE = "prepared.onnx", "prepare.json", "model_inputs.npz"
FULL_MLIR_FILE, LOCATIONS_FILE, MANIFEST_FILE = "full.mlir", "locations.json", "manifest.json"
REPORT_SUMMARY_FILE = "report_summary.json"
CALIBRATION_FILE, QUANTIZED_MODEL_FILE, QUANTIZE_INFO_FILE = "calibration.json", "quantized.onnx", "quantize.json"
#: Folders of a work directory: the units of work (pipeline/units.py) and the
#: compile batches (of the layers; in FULL_DIR, of the partitions).
UNITS_DIR, BATCHES_DIR = "units", "batches"
#: The value store (core/value_store.py): every tensor value of the discovery once, named by digest.
VALUES_DIR = "values"
#: Files of a layer (in LAYERS_DIR/<slug>/): the values it receives in the whole-model run and
#: its reference (both records of value references into VALUES_DIR); in its executor's folder,
#: the executor's outputs, kept where the verdict is not a success (or keep_outputs is set).
LAYER_INPUTS_FILE, LAYER_REFERENCE_FILE, EXECUTOR_OUTPUTS_FILE = "inputs.json", "reference.json", "outputs.npz"
#: Files of a (layer, executor) verdict and of the full-model run (in FULL_DIR).
RESULT_FILE = "result.json"
ASSIGNMENT_FILE, PLAN_FILE, REFERENCE_FILE, PARTITIONS_DIR = "assignment.json", "plan.json", "reference.npz", "partitions"
#: The model's outputs of the last full-model run (in FULL_DIR, beside its reference.npz).
RUN_OUTPUTS_FILE = "outputs.npz"
#: The one-module run's folder in PARTITIONS_DIR: ``module-<fingerprint>``; its side file and
#: compile record (the rest is made again by its compile).
MODULE_PARTITION_PREFIX, MODULE_SIDE_FILE, COMPILED_FILE = "module-", "placement.json", "compiled.json"
#: Files of a layer folder and of a partition folder alike: the ONNX model, its MLIR, the
#: import record, the compiled module; of a compile batch: its record and merged MLIR.
MODEL_FILE, MLIR_FILE, IMPORT_FILE, MODULE_FILE = "model.onnx", "model.mlir", "import.json", "module.vmfb"
BATCH_FILE, BATCH_MLIR_FILE = "batch.json", "batch.mlir"
#: A partition's run files (given to and written by the tool that runs it), in its folder.
PARTITION_RUN_DIR = "run"
#: A model handed to a discovery with its input values, as a folder: ``run --reduce``'s
#: reproducer (in reduced_dir, weights inside), a conformance node test.
CASE_MODEL_FILE, CASE_INPUTS_FILE = "model.onnx", "inputs.npz"
#: A model sweep's files in its output directory (beside one folder per model): the
#: summary, its page and the sweep's run lock.
SWEEP_JSON, SWEEP_HTML, SWEEP_LOCK = "sweep.json", "sweep.html", ".torq-gen-config-sweep.lock"


def reduced_dir(subgraph_suffix: str = "") -> str:
    """The folder ``run --reduce`` writes its reproducer to, beside the report (relative
    to the output directory): ``reduced``, or ``reduced_subgraph_<f>_<t>`` for a subgraph."""
    return f"reduced{subgraph_suffix}"


def work_dir(name: str) -> str:
    """The work directory of report ``name``, relative to the output directory."""
    return f"{WORK_ROOT}/{name}"


def report_file(name: str) -> str:
    """File name of the report JSON of ``name``."""
    return f"{REPORT_PREFIX}{name}.json"


def compiler_file(name: str) -> str:
    """File name of the compiler JSON of ``name``."""
    return f"{REPORT_PREFIX}{name}_compiler.json"


def html_report_file(name: str) -> str:
    """File name of the HTML report of ``name`` (next to its report JSON)."""
    return f"{REPORT_PREFIX}{name}.html"


def lock_file(name: str) -> str:
    """File name of the run lock of ``name`` (in the output directory)."""
    return f".torq-gen-config-{name}.lock"


def full_run_file(name: str, file: str) -> str:
    """A file of the full-model run of ``name`` (``ASSIGNMENT_FILE``, ``RESULT_FILE``, ...),
    relative to the output directory: ``work/<name>/full/<file>``."""
    return f"{work_dir(name)}/{FULL_DIR}/{file}"


def layer_result_file(layers_dir: str | os.PathLike, slug: str, executor: str) -> str:
    """The verdict file of one (layer, executor) test under a layers directory (a string:
    the rules' paths)."""
    return os.fspath(LayerFolder(Path(layers_dir) / slug).executor(executor).result)


def user_choices_file(name: str) -> str:
    """The person-made choices of ``edit`` for ``name``, relative to the output directory."""
    return f"{work_dir(name)}/user_choices.json"


def mark_outdated(marker: str | os.PathLike, reason: str | None = None) -> None:
    """Create the out-of-date marker (:data:`OUTDATED_MARKER`) with the time it was set;
    with ``reason``, write it anew with that reason on its second line (what the report's
    staleness says instead of "a later run did not finish")."""
    p = Path(marker)
    p.parent.mkdir(parents=True, exist_ok=True)
    if reason is not None:
        p.write_text(time.strftime("%Y-%m-%d %H:%M:%S") + "\n" + reason.replace("\n", " ") + "\n")
    elif not p.exists():
        p.write_text(time.strftime("%Y-%m-%d %H:%M:%S") + "\n")


def clear_outdated(marker: str | os.PathLike) -> None:
    """Remove the out-of-date marker (the report was just written)."""
    Path(marker).unlink(missing_ok=True)


@dataclass(frozen=True)
class ExecutorFolder:
    """The files of one (layer, executor) test: ``layers/<slug>/<executor>/``."""

    path: Path

    @property
    def result(self) -> Path:
        """The verdict (one line of JSON)."""
        return self.path / RESULT_FILE

    @property
    def module(self) -> Path:
        """The compiled module of the layer alone (IREE)."""
        return self.path / MODULE_FILE


@dataclass(frozen=True)
class LayerFolder:
    """The files of one layer: ``work/<name>/layers/<slug>/``."""

    path: Path

    @property
    def model(self) -> Path:
        """The layer's ONNX model (the graph; weights in the weight store)."""
        return self.path / MODEL_FILE

    @property
    def mlir(self) -> Path:
        """The layer's MLIR (IREE's ONNX importer)."""
        return self.path / MLIR_FILE

    @property
    def imported(self) -> Path:
        """The import's record (status, message)."""
        return self.path / IMPORT_FILE

    @property
    def reference(self) -> Path:
        """The record of the layer's reference outputs (value references)."""
        return self.path / LAYER_REFERENCE_FILE

    def executor(self, name: str) -> ExecutorFolder:
        """The folder of this layer's test on executor ``name``."""
        return ExecutorFolder(self.path / name)


@dataclass(frozen=True)
class PartitionFolder:
    """The files of one partition of a full-model run: ``full/partitions/<pid>/`` (also
    ``full/reduce/partitions/<pid>/``)."""

    path: Path

    @property
    def mlir(self) -> Path:
        """The partition's MLIR (IREE)."""
        return self.path / MLIR_FILE

    @property
    def compiled(self) -> Path:
        """The compile record (status, time, artifact)."""
        return self.path / COMPILED_FILE


@dataclass(frozen=True)
class WorkDir:
    """The work directory of one report name (``work/<name>/``, :func:`work_dir`) as a
    reader outside the run context finds it (conformance): its layers and their manifest."""

    path: Path

    @classmethod
    def of(cls, output_dir: str | os.PathLike, name: str) -> "WorkDir":
        """The work directory of report ``name`` in ``output_dir``."""
        return cls(Path(output_dir) / work_dir(name))

    @property
    def layers(self) -> Path:
        """The layer folders and the split's manifest."""
        return self.path / LAYERS_DIR

    @property
    def manifest(self) -> Path:
        """The split's layer manifest."""
        return self.layers / MANIFEST_FILE
