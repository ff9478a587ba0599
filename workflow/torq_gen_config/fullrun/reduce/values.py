"""The values of every tensor of a whole-model reference run, kept on disk (one ``.npy``
per tensor, ``index.json``): what ``run --reduce`` feeds each candidate subgraph and
compares its outputs with."""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path
from typing import Callable

from ...core.fileio import read_json, write_json
from ...core.lazy import np
from ...reference import load_reference
from ...reference.model_run import run_model_by_node, run_summary


class TensorValues:
    """The kept values in ``directory`` (``<name hash>.npy`` files, ``index.json``: tensor
    name -> file, the digest of the model and inputs they belong to, the run's summary)."""

    def __init__(self, directory: str | Path):
        self.dir = Path(directory)
        self.files: dict[str, str] = {}

    def __contains__(self, name: str) -> bool:
        return name in self.files

    def record(self, model, reference_npz: str, digest: str, *, timeout_s: float,
               progress: Callable[[str], None] | None = None) -> dict:
        """Run ``model`` node by node (:func:`~torq_gen_config.reference.model_run.run_model_by_node`:
        ONNX Runtime, onnx's reference implementation where it fails) on the inputs of
        ``reference_npz`` and keep every array value as it is made (memory stays bounded by
        the live tensors). Values kept for the same ``digest`` are reused when every file
        is still readable; damaged or other ones are made again.

        Returns:
            The run's summary (:func:`~torq_gen_config.reference.model_run.run_summary`).
        """
        index_path = self.dir / "index.json"
        if index_path.is_file():
            try:
                index = read_json(index_path, "reduction values index")
                if index.get("digest") == digest and self._readable(index["files"]):
                    self.files = index["files"]
                    return index["run"]
            except Exception:  # a damaged index: the run is made again
                pass
            if progress:
                progress("the kept reference values are out of date or damaged: running the model again")
        shutil.rmtree(self.dir, ignore_errors=True)
        self.dir.mkdir(parents=True)
        inputs, _, _ = load_reference(reference_npz)
        files: dict[str, str] = {}

        def on_value(name: str, value) -> None:
            if isinstance(value, np.ndarray):  # sequences are not kept: their readers cannot be fed
                file = hashlib.sha1(name.encode()).hexdigest()[:16] + ".npy"
                np.save(self.dir / file, value, allow_pickle=False)
                files[name] = file

        res = run_model_by_node(model, inputs, on_value=on_value, timeout_s=timeout_s)
        summary = run_summary(res)
        write_json(index_path, {"digest": digest, "files": files, "run": summary})
        self.files = files
        return summary

    def load(self, name: str):
        """The value of tensor ``name`` (numpy array). KeyError: the run has none."""
        return np.load(self.dir / self.files[name], allow_pickle=False)

    def _readable(self, files: dict[str, str]) -> bool:
        """True when every value file exists and is a plain ``.npy`` (its header is read)."""
        try:
            for f in files.values():
                np.load(self.dir / f, mmap_mode="r", allow_pickle=False)
        except Exception:
            return False
        return True
