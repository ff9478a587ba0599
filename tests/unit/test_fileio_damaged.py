"""fileio.load_npz: a damaged work archive is one error naming it, and it is removed."""

import numpy as np
import pytest

from torq_gen_config.core.errors import DamagedWorkFile
from torq_gen_config.core.fileio import load_npz, save_npz


def test_a_damaged_npz_is_named_and_removed(tmp_path):
    p = tmp_path / "reference.npz"
    save_npz(p, {"a": np.arange(1000, dtype=np.float32)}, {"k": 1})
    arrays, meta = load_npz(p)
    assert meta["k"] == 1 and arrays["a"].shape == (1000,)
    p.write_bytes(p.read_bytes()[:200])
    with pytest.raises(DamagedWorkFile) as e:
        load_npz(p)
    assert str(p) in str(e.value) and "removed it" in str(e.value) and not p.exists()
    with pytest.raises(FileNotFoundError):  # missing is not damaged
        load_npz(p)


def test_an_archive_without_its_meta_is_damaged(tmp_path):
    p = tmp_path / "x.npz"
    np.savez(p, a=np.zeros(3))
    with pytest.raises(DamagedWorkFile):
        load_npz(p)
