"""torq-gen-config: per-layer executor discovery for ONNX models.

The package holds all logic of the workflow (model preparation, layer split,
references, MLIR import and locations, backends, comparison, report) and the
``torq-gen-config`` command line. The Snakemake rules in ``rules/`` only wire
files to the functions in :mod:`torq_gen_config.pipeline.steps` (one module per rules file).
"""

__version__ = "0.1.0"
REPORT_FORMAT_VERSION = "1.1"
