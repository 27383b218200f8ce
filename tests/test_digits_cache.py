"""examples/digits.py: the cached digits split is scikit-learn's split, array for array, and a cache file that
is not this user's own, or does not hold what it should, is never used."""
from __future__ import annotations

import os

import numpy as np
import pytest

from examples import digits


@pytest.fixture
def cache(tmp_path, monkeypatch):
    d = tmp_path / "cache"
    monkeypatch.setenv("HPC_JABAS_CACHE", str(d))
    return d


def _reference(seed):
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split
    X, y = load_digits(return_X_y=True)
    return train_test_split(X / 16.0, y, test_size=0.25, random_state=seed, stratify=y)


@pytest.mark.parametrize("seed", [0, 3])
def test_the_cached_split_is_scikit_learns(cache, seed):
    first = digits.digits_split(seed)                   # computed, written
    files = list(cache.glob("digits-*.npz"))
    assert len(files) == 1 and f"seed{seed}" in files[0].name
    second = digits.digits_split(seed)                  # read back
    for a, b, c in zip(_reference(seed), first, second, strict=True):
        assert a.dtype == b.dtype == c.dtype and np.array_equal(a, b) and np.array_equal(a, c)
    x, y = digits.digits_all()
    from sklearn.datasets import load_digits
    X, Y = load_digits(return_X_y=True)
    assert np.array_equal(x, X / 16.0) and np.array_equal(y, Y)


def _plant(cache, seed=0):
    """A cache file of the right name whose labels are all 7."""
    digits.digits_split(seed)
    (path,) = cache.glob(f"digits-*seed{seed}-*.npz")
    with np.load(path, allow_pickle=False) as z:
        d = {k: z[k] for k in digits.KEYS}
    d["y"] = np.full_like(d["y"], 7)
    with open(path, "wb") as f:
        np.savez(f, **d)
    return path


def test_a_cache_file_others_may_write_is_not_read(cache):
    path = _plant(cache)
    ytr = digits.digits_split(0)[2]
    assert (ytr == 7).all()                              # our own file is read as it is (the premise)
    os.chmod(path, 0o666)
    ytr = digits.digits_split(0)[2]
    assert len(set(ytr.tolist())) == 10                  # not read: recomputed ...
    assert (os.stat(path).st_mode & 0o022) == 0          # ... and replaced by a private file
    path = _plant(cache)
    os.chmod(path.parent, 0o777)
    assert len(set(digits.digits_split(0)[2].tolist())) == 10   # a directory others may write: not read either


@pytest.mark.parametrize("damage", ["truncate", "shape", "pickle"])
def test_a_damaged_cache_file_is_rebuilt(cache, damage):
    digits.digits_split(0)
    (path,) = cache.glob("digits-*.npz")
    if damage == "truncate":
        path.write_bytes(path.read_bytes()[:100])
    elif damage == "shape":
        with open(path, "wb") as f:
            np.savez(f, x=np.zeros((5, 64)), y=np.zeros(5, dtype=np.int64), train_idx=np.arange(3),
                     test_idx=np.arange(3, 5))
    else:                                                # an object array: np.load refuses it without pickle
        with open(path, "wb") as f:
            np.savez(f, x=np.array([{"a": 1}], dtype=object), y=np.zeros(1), train_idx=np.arange(1),
                     test_idx=np.arange(1))
    got = digits.digits_split(0)
    for a, b in zip(_reference(0), got, strict=True):
        assert np.array_equal(a, b)


def test_a_failed_cache_write_leaves_no_temporary_file_and_still_gives_the_split(cache, monkeypatch):
    def full_disk(*a, **k):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(digits.np, "savez", full_disk)
    got = digits.digits_split(0)
    for a, b in zip(_reference(0), got, strict=True):
        assert np.array_equal(a, b)
    assert list(cache.iterdir()) == []                   # neither the cache file nor a .digits-* temporary
