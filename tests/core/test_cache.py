"""The one disk cache (fedlib.core.cache): fingerprints that see every byte, shape and dtype; atomic files."""
import numpy as np
import torch

from fedlib.core import cache


def test_fingerprint_sees_values_shapes_dtypes_and_order():
    a = np.arange(6.0)
    base = cache.fingerprint("x", a, 3)
    assert base == cache.fingerprint("x", a.copy(), 3)
    assert len({base, cache.fingerprint("x", a.reshape(2, 3), 3), cache.fingerprint("x", a.astype(np.float32), 3),
                cache.fingerprint("x", a + 1e-12, 3), cache.fingerprint(3, a, "x"), cache.fingerprint("y", a, 3),
                cache.fingerprint("x", torch.from_numpy(a), 3)}) == 7
    assert cache.fingerprint([torch.ones(2, dtype=torch.bfloat16)]) == cache.fingerprint([torch.ones(2, dtype=torch.bfloat16)])
    assert len(cache.fingerprint(a, length=12)) == 12


def test_npz_files_are_atomic_and_unreadable_ones_read_as_missing(tmp_path):
    path = tmp_path / "sub" / "r.npz"
    cache.save_npz(path, x=np.arange(3), y=np.eye(2))
    got = cache.load_npz(path)
    assert set(got) == {"x", "y"} and np.array_equal(got["y"], np.eye(2))
    assert list(path.parent.iterdir()) == [path]          # no temporary file left
    path.write_bytes(b"partial")
    assert cache.load_npz(path) is None and cache.load_npz(tmp_path / "none.npz") is None


def test_memory_keeps_a_function_s_calls(tmp_path, monkeypatch):
    monkeypatch.setenv("FEDLIB_CACHE", str(tmp_path))
    calls = []

    def square(v):
        calls.append(v)
        return v * v

    kept = cache.memory("squares").cache(square)
    assert kept(3) == 9 and kept(3) == 9 and calls == [3]
    assert (tmp_path / "squares").is_dir()
