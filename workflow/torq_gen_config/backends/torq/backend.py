"""The TORQ backend: one layer compiled with ``torq-compile`` forced onto one TORQ
executor (nss, css or host), run with ``torq-run-module`` (see the package doc)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping, Sequence

from ...core.logs import append_record
from ...core.tools import ToolNotFoundError, run_tool, tool_version
from ..base import Backend, CompiledArtifact, RunWideOption, StageError, check_inputs, raise_for_tool_failure
from ..iree_tools import compile_mlir_module
from .tensors import read_output_bin, write_input_bin
from ...core.layout import MODULE_FILE
from .toolchain import FORCING_FLAGS, FUNCTION, _hw_flags, _parse_options, find_torq_tool
from .whole_model import TorqWholeModel

if TYPE_CHECKING:  # pragma: no cover
    import numpy as np

    from ..whole_model import WholeModel

INPUTS_DIR = "inputs"
OUTPUTS_DIR = "outputs"


class TorqBackend(Backend):
    """Executor on a TORQ NPU executor (nss, css or host), via torq-compile / torq-run-module."""

    kind = "torq"
    needs_mlir = True
    chain_unavailable = ("the torq backend is not available as the executor of one partition of a chain: "
                         "a torq assignment is compiled as one whole model (torq-gen-config run does that "
                         "when every assigned executor is a torq one)")
    takes_tool_options = True
    run_wide_options = (
        RunWideOption("torq_hw", "--torq-hw", "TARGET", "target hardware for torq executors (torq-compile --torq-hw); "
                      "empty keeps each executor's option"),
        RunWideOption("torq_hw_type", "--torq-hw-type", "TYPE", "runtime hardware type for torq executors "
                      "(torq-run-module --torq_hw_type, e.g. sim); empty keeps each executor's option"),
    )
    batch_compile = True
    inline_weights_only = "TORQ's compiler packs the weights into the module at compile time"

    @classmethod
    def whole_model(cls) -> "WholeModel":
        """The whole-model compile with ``--torq-executor-map`` (:mod:`.whole_model`)."""
        return TorqWholeModel(cls)

    def __init__(self, name: str, options: dict | None):
        """Validate the options.

        Raises:
            ConfigError: unknown option or wrong type; ``executor`` not nss/css/host
                (or, without the option, an executor name that is not one of them);
                ``compile_flags``/``run_flags`` not lists of strings.
        """
        super().__init__(name, options)
        o = _parse_options(name, self.options)
        self.executor: str = o["executor"]
        self.torq_hw: str = o["torq_hw"]
        self.torq_hw_type: str = o["torq_hw_type"]
        self.compile_flags: list[str] = o["compile_flags"]
        self.run_flags: list[str] = o["run_flags"]
        self._tools: dict[str, str] = {}

    # ----------------------------------------------------------------- tools
    def _tool(self, name: str) -> str:
        if name not in self._tools:
            self._tools[name] = find_torq_tool(name)
        return self._tools[name]

    def forcing_flags(self) -> list[str]:
        """The disable flags that force a layer onto this executor."""
        return list(FORCING_FLAGS[self.executor])

    def compile_argv(self, mlir_path: str, output_path: str) -> list[str]:
        """The full ``torq-compile`` command line for one layer (see the module doc).

        Raises:
            ToolNotFoundError: ``torq-compile`` cannot be found.
        """
        return [self._tool("torq-compile"), mlir_path, "-o", output_path,
                *_hw_flags(self.torq_hw, self.torq_hw_type), *self.forcing_flags(), *self.compile_flags]

    def run_argv(self, module: str, inputs: Sequence[tuple[str, str]], outputs: Sequence[str],
                 function: str = FUNCTION) -> list[str]:
        """The full ``torq-run-module`` command line (see :func:`run_module_argv`).

        Raises:
            ToolNotFoundError: ``torq-run-module`` cannot be found.
        """
        return [self._tool("torq-run-module"), f"--module={module}", f"--function={function}",
                *[f"--output=@{p}" for p in outputs], f"--torq_hw_type={self.torq_hw_type}", *self.run_flags,
                *[f"--input={spec}=@{p}" for spec, p in inputs]]

    # -------------------------------------------------------------- compile
    def compile(
        self,
        *,
        onnx_path: str,
        mlir_path: str | None,
        work_dir: str,
        timeout_s: float,
        log_path: str | None,
    ) -> CompiledArtifact:
        """Compile the layer's MLIR into ``<work_dir>/module.vmfb`` on this TORQ executor.

        The command (run in ``work_dir``) is ``torq-compile <mlir> -o <work>/module.vmfb
        --torq-hw=<torq_hw> [--torq-target-host-triple=native] <forcing flags>
        <compile_flags>``. An old module is removed first, a failed compile's partial
        output afterwards.

        Returns:
            CompiledArtifact with ``path`` = the ``.vmfb``, ``compile_ms``, and ``info`` =
            ``{"argv", "onnx_path", "mlir_path", "executor", "torq_hw", "torq_hw_type",
            "function", "vmfb_bytes", "signature", ["compiler_stderr"]}``.

        Raises:
            StageError: ``"compile"`` (non-zero exit, or ``torq-compile`` not found:
                the message names every place searched), ``"timeout"`` / ``"crash"``
                with ``during="compile"``.
            ValueError: ``mlir_path`` is None.
            FileNotFoundError: ``mlir_path`` does not exist.
        """
        if mlir_path is None:
            raise ValueError(f"executor {self.name!r} (torq) needs the layer's MLIR file, got mlir_path=None")
        if not os.path.isfile(mlir_path):
            raise FileNotFoundError(f"layer MLIR file not found: {mlir_path}")
        work = Path(work_dir).absolute()
        work.mkdir(parents=True, exist_ok=True)
        out = work / MODULE_FILE
        out.unlink(missing_ok=True)
        try:
            argv = self.compile_argv(os.path.abspath(mlir_path), str(out))
        except ToolNotFoundError as e:
            append_record(log_path, f"torq backend: {e}")
            raise StageError("compile", str(e)) from None
        return compile_mlir_module(argv, tool="torq-compile", out=out, mlir_path=mlir_path, onnx_path=onnx_path,
                                   timeout_s=timeout_s, log_path=log_path, cwd=str(work),
                                   info={"executor": self.executor, "torq_hw": self.torq_hw,
                                         "torq_hw_type": self.torq_hw_type})

    # ------------------------------------------------------------------ run
    def run(
        self,
        artifact: CompiledArtifact,
        *,
        inputs: dict[str, "np.ndarray"],
        input_names: list[str],
        output_names: list[str],
        work_dir: str,
        timeout_s: float,
        log_path: str | None,
        output_specs: Sequence[Mapping[str, Any]] | None = None,
    ) -> tuple[dict[str, "np.ndarray"], float]:
        """Run the compiled module once with ``torq-run-module``.

        Inputs go to ``<work>/inputs/input_<i>.bin`` (raw, ``input_names`` order),
        outputs come back from ``<work>/outputs/output_<i>.bin`` (raw), read with the
        shapes/dtypes of ``output_specs`` when given, else of the layer's MLIR
        signature (``artifact.info["signature"]``).

        Args:
            artifact: from :meth:`compile` (or any CompiledArtifact whose ``path`` is a
                TORQ ``.vmfb``; ``info["function"]`` names the function, default main).
            inputs, input_names, output_names, work_dir, timeout_s, log_path: as in
                :meth:`Backend.run`.
            output_specs: ``[{"shape": [...], "dtype": "float32"}, ...]``, one per
                output name (overrides the signature).

        Returns:
            ``(outputs, run_ms)``; ``run_ms`` is the wall time of the ``torq-run-module``
            process (simulator start-up included).

        Raises:
            StageError: ``"run"`` (non-zero exit, ``torq-run-module`` not found, an
                input dtype it cannot take, a missing or ill-sized output file, no
                output shapes known), ``"timeout"`` / ``"crash"`` with ``during="run"``.
            ValueError: an input is missing, ``artifact.path`` is None, or
                ``output_specs`` has the wrong length.
            FileNotFoundError: the module file does not exist.
        """
        check_inputs(inputs, input_names)
        if artifact.path is None:
            raise ValueError(f"executor {self.name!r}: artifact has no module path")
        module = os.path.abspath(artifact.path)
        if not os.path.isfile(module):
            raise FileNotFoundError(f"TORQ module not found: {module}")
        info = artifact.info or {}
        if output_specs is not None:
            specs = [dict(s) for s in output_specs]
            if len(specs) != len(output_names):
                raise ValueError(f"output_specs has {len(specs)} entries for {len(output_names)} outputs")
        else:
            specs = ((info.get("signature") or {}).get("outputs") or [])
            if len(specs) != len(output_names):
                raise StageError(
                    "run",
                    f"cannot read torq-run-module's raw outputs: the layer's MLIR signature gives "
                    f"{len(specs)} result type(s) for {len(output_names)} outputs {output_names}",
                )
        work = Path(work_dir).absolute()
        in_dir, out_dir = work / INPUTS_DIR, work / OUTPUTS_DIR
        in_dir.mkdir(parents=True, exist_ok=True)
        out_dir.mkdir(parents=True, exist_ok=True)

        in_files: list[tuple[str, str]] = []
        for i, name in enumerate(input_names):
            path = in_dir / f"input_{i}.bin"
            try:
                spec = write_input_bin(inputs[name], path)
            except ValueError as e:
                raise StageError("run", f"input {name!r}: {e}; torq-run-module cannot read it") from None
            in_files.append((spec, str(path)))
        out_files = [str(out_dir / f"output_{i}.bin") for i in range(len(output_names))]
        for p in out_files:
            Path(p).unlink(missing_ok=True)
        try:
            argv = self.run_argv(module, in_files, out_files, function=info.get("function") or FUNCTION)
        except ToolNotFoundError as e:
            append_record(log_path, f"torq backend: {e}")
            raise StageError("run", str(e)) from None

        res = run_tool(argv, timeout_s=timeout_s, cwd=str(work), log_path=log_path)
        raise_for_tool_failure(res, tool="torq-run-module", during="run", timeout_s=timeout_s)

        outputs: dict[str, Any] = {}
        for name, path, spec in zip(output_names, out_files, specs):
            if not os.path.isfile(path):
                raise StageError("run", f"torq-run-module exited with status 0 but wrote no output file {path} "
                                        f"for {name!r}")
            try:
                outputs[name] = read_output_bin(path, spec["shape"], spec["dtype"])
            except ValueError as e:
                raise StageError("run", f"output {name!r}: {e}") from None
        return outputs, res.wall_ms

    # ------------------------------------------------------------- describe
    def describe(self, *, probe_timeout_s: float = 60.0) -> dict:
        """Provenance of this executor (the compiler's ``--version`` is probed once per
        run, within ``probe_timeout_s`` seconds: :func:`torq_gen_config.core.tools.tool_version`).

        Returns:
            ``{"kind", "name", "executor", "torq_hw", "torq_hw_type", "forcing_flags",
            "compile_flags", "run_flags", "torq_compile", "torq_run_module",
            "torq_compiler_version"}``; a tool that cannot be found appears as
            ``{"error": message}`` (the places searched) instead of its path.
        """
        d: dict[str, Any] = {
            "kind": self.kind,
            "name": self.name,
            "executor": self.executor,
            "torq_hw": self.torq_hw,
            "torq_hw_type": self.torq_hw_type,
            "forcing_flags": self.forcing_flags(),
            "compile_flags": list(self.compile_flags),
            "run_flags": list(self.run_flags),
        }
        for tool, key in (("torq-compile", "torq_compile"), ("torq-run-module", "torq_run_module")):
            try:
                d[key] = self._tool(tool)
            except ToolNotFoundError as e:
                d[key] = {"error": str(e)}
        d["torq_compiler_version"] = (tool_version(d["torq_compile"], timeout_s=probe_timeout_s)
                                      if isinstance(d["torq_compile"], str) else None)
        return d
