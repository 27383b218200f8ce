"""scikit-learn's bundled 8x8 digits (no download), split once and kept as plain arrays.

Importing scikit-learn (and SciPy with it) costs about 1.5 s of CPU in every process, and every rank of
every run loads this data. So the first call loads the data with scikit-learn and makes the stratified
split; the arrays are then kept in an ``.npz`` file in the user's cache (``$HPC_JABAS_CACHE``, else
``$XDG_CACHE_HOME/hpc-jabas``, else ``~/.cache/hpc-jabas``), which later processes read in milliseconds.
The file holds numbers only and is read without pickle (``allow_pickle=False``), and only when this
user owns it and nobody else may write it or its directory; one that does not hold what it should is
rebuilt. Its name carries scikit-learn's version, the seed and the test fraction, so another version's
split is never reused.
"""
from __future__ import annotations

import importlib.metadata
import os
import stat
import tempfile
import zipfile
from pathlib import Path

import numpy as np

N_SAMPLES, N_FEATURES, N_CLASSES = 1797, 64, 10
KEYS = ("x", "y", "train_idx", "test_idx")


def cache_dir() -> Path:
    env = os.environ.get("HPC_JABAS_CACHE")
    if env:
        return Path(env)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "hpc-jabas"


def _compute(seed: int, test_size: float) -> dict[str, np.ndarray]:
    try:
        from sklearn.datasets import load_digits
        from sklearn.model_selection import train_test_split
    except ImportError:
        from hpc_jabas import ConfigError  # under run_main: one line, exit code 2, on every rank
        raise ConfigError("the digits examples need scikit-learn, which is not installed: "
                          "pip install 'hpc-jabas[examples]'") from None
    X, y = load_digits(return_X_y=True)
    # splitting the indices is splitting the arrays: train_test_split draws one permutation for all of them
    tr, te = train_test_split(np.arange(len(y)), test_size=test_size, random_state=seed, stratify=y)
    return {"x": X / 16.0, "y": y, "train_idx": tr, "test_idx": te}


def _valid(d: dict[str, np.ndarray]) -> bool:
    x, y, tr, te = (d[k] for k in KEYS)
    if not (x.shape == (N_SAMPLES, N_FEATURES) and x.dtype == np.float64 and y.shape == (N_SAMPLES,)
            and y.dtype.kind == tr.dtype.kind == te.dtype.kind == "i" and tr.ndim == te.ndim == 1):
        return False
    both = np.concatenate([tr, te])
    return (bool(np.isfinite(x).all()) and 0.0 <= float(x.min()) and float(x.max()) <= 1.0
            and 0 <= int(y.min()) and int(y.max()) < N_CLASSES
            and both.shape == (N_SAMPLES,) and bool((np.sort(both) == np.arange(N_SAMPLES)).all()))


def _private(path: Path) -> bool:
    """Owned by this user, and neither the file nor its directory writable by anyone else."""
    for p in (path, path.parent):
        st = os.stat(p)
        if st.st_uid != os.geteuid() or stat.S_IMODE(st.st_mode) & (stat.S_IWGRP | stat.S_IWOTH):
            return False
    return True


def _read(path: Path) -> dict[str, np.ndarray] | None:
    try:
        if not _private(path):
            return None
        with np.load(path, allow_pickle=False) as z:
            d = {k: z[k] for k in KEYS}
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile):
        return None
    return d if _valid(d) else None


def _load(seed: int, test_size: float) -> dict[str, np.ndarray]:
    try:
        version = importlib.metadata.version("scikit-learn")
    except importlib.metadata.PackageNotFoundError:
        version = "unknown"
    path = cache_dir() / f"digits-sklearn{version}-seed{seed}-test{test_size:g}.npz"
    d = _read(path)
    if d is None:
        d = _compute(seed, test_size)
        tmp = None
        try:                                            # atomic: concurrent first ranks each write a whole file
            path.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".digits-", suffix=".npz")
            with os.fdopen(fd, "wb") as f:
                np.savez(f, **d)
            os.replace(tmp, path)
        except OSError:                                 # no writable cache (or a full disk): computed every time
            if tmp is not None:
                Path(tmp).unlink(missing_ok=True)
    return d


def digits_split(seed: int = 0, test_size: float = 0.25) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(x_train, x_test, y_train, y_test): pixels scaled to [0, 1] (float64), labels 0-9 (int64); exactly
    ``train_test_split(X / 16, y, test_size=test_size, random_state=seed, stratify=y)``."""
    d = _load(seed, test_size)
    x, y = d["x"], d["y"]
    return x[d["train_idx"]], x[d["test_idx"]], y[d["train_idx"]], y[d["test_idx"]]


def digits_all() -> tuple[np.ndarray, np.ndarray]:
    """All 1797 samples in scikit-learn's order: (x [N, 64] in [0, 1] (float64), y [N])."""
    d = _load(0, 0.25)
    return d["x"], d["y"]
