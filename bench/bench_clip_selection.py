"""Issue 32 item 4, the clip's selection: where a stated explained-variance point's error comes
from, split by the probe's private clip.

    python -m bench.bench_clip_selection [--reps 300] [--only digits] [--eps 0.4 0.5] [--ks 1 2]

``analyze_gauss`` with ``center: "private"`` (as :mod:`bench.bench_honest_point`, seeds
``1000 + rep``, the same data sets, the same truth: the share of the centred sum of squares of
the rows clipped to C = 1 that the released basis keeps). Per cell and for the stated, the
hidden and all releases: the mean absolute and signed error of the point (before any
withholding, the recorded call's estimate), the part of the error that is the clip's (the
share the exact sums measure, rows clipped at ``variance_clip_norm`` and centred on the
private centre, minus the truth), the mean released ``variance_clip_norm``, and the private
centre's bias: its actual split ``n ||U^T delta||^2``, ``n ||(I - U U^T) delta||^2`` (over the
total) against the split the estimator removed. Also the correlation of the released clip
with the point's error and with the decision to state it.
"""

from __future__ import annotations

import argparse
from typing import Any

import numpy as np

from bench import bench_honest_point as honest
from service.mechanisms import analyze_gauss
from service.mechanisms.base import PublicContext, ReleaseSpec
from service.mechanisms.linalg import clip_rows

_energies: list[tuple[Any, float]] = []
_real_extras = analyze_gauss.variance_extras


def _recording_extras(*args: Any, **kwargs: Any) -> Any:
    """``variance_extras`` that keeps the exact sums and their scale of each call."""
    energy = args[7] if len(args) > 7 else kwargs.get("energy")
    scale = args[6] if len(args) > 6 else kwargs.get("scale", 1.0)
    _energies.append((energy, float(scale)))
    return _real_extras(*args, **kwargs)


analyze_gauss.variance_extras = _recording_extras


def runs(rows: np.ndarray[Any, Any], eps: float, k: int, reps: int) -> dict[str, np.ndarray]:
    """One release per seed: its clip, flag, point, truth, measured share and centre bias."""
    n, d = rows.shape
    ctx = PublicContext(n_rows=n, n_cols=d, row_norm_bound=1.0)
    params = honest.MECHANISM.parse_params({"center": "private"})
    resolved = honest.MECHANISM.prepare(ctx, k, eps, honest.DELTA, params)
    spec = ReleaseSpec(k=k, epsilon=eps, delta=honest.DELTA, params=resolved)
    mean = clip_rows(rows, 1.0).mean(axis=0)
    keys = ("clip", "stated", "point", "truth", "measured", "total", "bias_c", "bias_r")
    keys += ("model_c", "model_r")
    out: dict[str, list[float]] = {key: [] for key in keys}
    for seed in range(reps):
        _energies.clear()
        honest._calls.clear()
        release = honest.MECHANISM.run(rows, spec, np.random.default_rng(1000 + seed))
        assert release.basis is not None and len(honest._calls) == 1 and len(_energies) == 1
        call = honest._calls[0]
        estimate = honest._real(*call)
        (captured, residual, _), scale = _energies[0]
        total = (captured + residual) * scale
        out["clip"].append(release.extras["variance_clip_norm"])
        out["stated"].append(0.0 if estimate.hidden else 1.0)
        out["point"].append(float(np.sum(estimate.ratio)))
        out["truth"].append(honest.truth(rows, release.basis))
        out["measured"].append(captured / (captured + residual))
        out["total"].append(total)
        if "center" in release.extras:
            delta = np.asarray(release.extras["center"]) - mean
            inside = n * float(np.sum((release.basis.T @ delta) ** 2))
            out["bias_c"].append(inside / total)
            out["bias_r"].append((n * float(delta @ delta) - inside) / total)
        else:
            out["bias_c"].append(np.nan)
            out["bias_r"].append(np.nan)
        out["model_c"].append(call[4][0] / total)
        out["model_r"].append(call[4][1] / total)
    return {key: np.asarray(values, dtype=float) for key, values in out.items()}


def summary(name: str, eps: float, k: int, got: dict[str, np.ndarray]) -> list[str]:
    """Table lines for one cell: stated, hidden, all."""
    error = got["point"] - got["truth"]
    clip_part = got["measured"] - got["truth"]
    stated = got["stated"] == 1
    lines = []
    for label, mask in (("stated", stated), ("hidden", ~stated), ("all", stated | ~stated)):
        if not mask.any():
            continue
        lines.append(
            f"| {name} | {eps} | {k} | {label} | {int(mask.sum())} "
            f"| {np.mean(np.abs(error[mask])):.3f} | {np.mean(error[mask]):+.3f} "
            f"| {np.mean(clip_part[mask]):+.3f} | {np.mean(got['clip'][mask]):.3f} "
            f"| {np.nanmean(got['bias_c'][mask]):.4f} / {np.nanmean(got['bias_r'][mask]):.4f} "
            f"| {np.mean(got['model_c'][mask]):.4f} / {np.mean(got['model_r'][mask]):.4f} |"
        )
    corr_error = np.corrcoef(got["clip"], error)[0, 1]
    corr_stated = np.corrcoef(got["clip"], got["stated"])[0, 1]
    lines.append(
        f"| {name} | {eps} | {k} | corr(clip, error) {corr_error:+.2f}, "
        f"corr(clip, stated) {corr_stated:+.2f} | | | | | | | |"
    )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--reps", type=int, default=300)
    parser.add_argument("--only", nargs="*", default=["digits"])
    parser.add_argument("--eps", type=float, nargs="*", default=[0.4, 0.5])
    parser.add_argument("--ks", type=int, nargs="*", default=[1, 2])
    args = parser.parse_args()
    print(
        "| data | eps | k | releases | count | point: mean abs error | mean error "
        "| the clip's part (measured share - truth) | mean variance_clip_norm "
        "| centre bias, actual: captured / residual (of the total) | removed: captured / residual |"
    )
    print("|---" * 11 + "|")
    for name, rows in honest.datasets(True).items():
        if name not in args.only:
            continue
        for eps in args.eps:
            for k in args.ks:
                for line in summary(name, eps, k, runs(rows, eps, k, args.reps)):
                    print(line, flush=True)


if __name__ == "__main__":
    main()
