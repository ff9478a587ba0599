"""Full-model run (``torq-gen-config run``): the whole prepared model with each op on
its assigned executor. One module per step: :mod:`.selection` (what to run),
:mod:`.partition` and :mod:`.plan` (how it is cut), :mod:`.compile` and
:mod:`.execute` (compile, run, compare), :mod:`.report_section` (the report).

IREE and ONNX Runtime have no per-op assignment pass, so the model runs as a chain
of *partitions* (per-layer modules chained through host numpy: the safe path of
docs/toolchain.md, 'Heterogeneous placement in one IREE module'):

1. Constant-producing nodes are folded (:func:`torq_gen_config.model.split.fold_constants`,
   the same folding as the layer split), so every remaining node of the prepared
   model belongs to a layer (manifest ``prepared_node_indices``).
2. Every layer gets an executor (:func:`~.selection.resolve_assignment`): the report's
   ``recommended_executor``, or the compiler JSON's entry for the layer's
   ``line:col``; a layer without one runs on the highest-priority executor whose
   status for that layer is not ``error`` (else the first executor), and the plan
   lists it with the reason.
3. A partition is a maximal run of consecutive nodes (graph order, which ONNX
   requires to be topological) with the same executor (:func:`~.partition.partition_runs`). A
   run of consecutive nodes of a topological order is convex, so running the
   partitions in order only ever needs tensors that earlier partitions (or the
   graph inputs) produced.
4. Each partition becomes a stand-alone ONNX model (:func:`~.partition.build_partition_model`):
   run-time inputs are graph inputs, folded values and initializers are
   initializers, and every tensor it produces that a node outside it (or the
   model's output) needs is a graph output. Its *pid* is a short hash of the model
   bytes and the executor definition as compiled (extra compiler options and the
   debug-IR directory included), so an unchanged partition keeps its compiled
   module and a change to one layer's executor recompiles only the partitions that
   contain or border it.
5. :func:`~.compile.compile_partition` compiles one partition for its executor (with
   ``compile_batch`` > 1 the partitions of one executor are compiled together,
   :mod:`.batches`: one module, one function per partition);
   :func:`~.execute.run_partitions` runs them in order, handing tensors from partition to
   partition as numpy arrays, compares the model's outputs with the ONNX Runtime
   reference of the whole prepared model (same metrics as the layer comparisons)
   and checks each partition against ONNX Runtime on the inputs it actually got
   (to tell which partition introduced a difference).

Files (under ``<output_dir>/work/full``): ``assignment.json`` (what the run was
asked to do), ``plan.json`` (partitions), ``partitions/<pid>/model.onnx``,
``model.mlir``, ``compiled.json`` and the module, ``reference.npz``,
``result.json``.

A backend that compiles whole models (:meth:`~torq_gen_config.backends.base.Backend.whole_model`,
e.g. TORQ, whose compiler has a per-op assignment pass, ``--torq-executor-map``) runs
the model uncut: when every executor the assignment names is of that backend, the
plan's ``mode`` is the backend kind and the plan, the compile and the run of its
single "partition" are the backend's hooks (``backends/torq/whole_model.py``).
Executors of such a backend and others in one assignment are an error; an executor
whose backend cannot run one partition of a chain (``chain_unavailable``) is never
a fallback.

Module mode (``run --run-mode``, :mod:`.module.mode`, :mod:`.module.run`): an assignment of
IREE executors whose devices are here compiled as ONE IREE module with per-op devices
(:mod:`.module.program`), where each layer ran read back from the compiled program; the
partitions of the same assignment run too when the module fails or differs.
"""
