"""Issue 24, item 5: a release whose directions do not stand out of its own noise says so.

Per mechanism that releases a basis: a case that must warn (pure noise or a tiny budget) and one
that must not (a strong spike, a large budget), fixed seeds with wide margins; and the shared
rule itself.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from service.mechanisms.base import PublicContext, ReleaseSpec
from service.mechanisms.registry import get_mechanism
from service.mechanisms.smooth_sensitivity import noisy_basis_stands_out
from service.mechanisms.usefulness import (
    WARNING_CODE,
    count_above,
    rectangular_edge,
    top_singular_values,
    usefulness_extras,
    wigner_edge,
)
from tests.mechanisms.synthetic import isotropic, near_subspace

DELTA = 1e-6


def release(
    name: str,
    data: np.ndarray,
    k: int,
    eps: float,
    delta: float,
    seed: int,
    raw: dict[str, Any] | None = None,
) -> Any:
    mechanism = get_mechanism(name)
    assert mechanism is not None
    n, d = data.shape
    ctx = PublicContext(n_rows=n, n_cols=d, row_norm_bound=1.0)
    params = mechanism.prepare(ctx, k, eps, delta, mechanism.parse_params(raw or {}))
    return mechanism.run(data, ReleaseSpec(k, eps, delta, params), np.random.default_rng(seed))


def warned(out: Any, k: int) -> bool:
    assert out.basis is not None
    above = out.extras["components_above_noise"]
    assert 0 <= above <= k
    has = "warning" in out.extras
    assert has == (above < k)
    if has:
        assert out.extras["warning_code"] == WARNING_CODE
        assert "indistinguishable from random" in out.extras["warning"]
    else:
        assert "warning_code" not in out.extras
    return has


def test_the_edges_and_the_count() -> None:
    assert wigner_edge(0.5, 16) == 4.0
    assert rectangular_edge(1.0, 4, 9) == 5.0
    values = np.array([5.0, 3.0, 1.0])
    assert count_above(values, 3, 2.0) == 2
    assert count_above(values, 1, 6.0) == 0
    # nothing is claimed to stand out of a non-finite computation
    assert count_above(np.array([np.inf, 1.0]), 2, 0.5) == 0
    assert count_above(values, 3, float("nan")) == 0
    assert top_singular_values(np.diag([3.0, 2.0]), 3) == pytest.approx([3.0, 2.0, 0.0])
    assert list(top_singular_values(np.full((2, 2), np.nan), 2)) == [0.0, 0.0]
    assert usefulness_extras(2, 2, "x") == {"components_above_noise": 2}
    shown = usefulness_extras(1, 2, "x")
    assert shown["components_above_noise"] == 1 and shown["warning_code"] == WARNING_CODE


def test_the_noise_rule_counts_pure_noise_out_and_a_spike_in() -> None:
    # The spiked-matrix threshold: a rank-1 spike of 1 in noise of edge 0.2 stands out; pure
    # noise (its top eigenvalue at the edge, up to small fluctuations) and a spike well below
    # the edge do not, at d = 400 with a margin of 10% on the edge.
    rng = np.random.default_rng(0)
    d, sigma = 400, 0.005
    noise = rng.normal(0.0, sigma, (d, d))
    noise = (noise + noise.T) / np.sqrt(2.0)
    u = rng.standard_normal(d)
    u /= np.linalg.norm(u)
    edge = wigner_edge(sigma, d)
    for strength, stands in ((1.0, True), (0.0, False), (0.05, False)):
        values = np.linalg.eigvalsh(strength * np.outer(u, u) + noise)[::-1]
        assert count_above(values, 1, 1.1 * edge) == int(stands)


def test_gap_perturbation_warns_when_the_gap_barely_passes() -> None:
    # Rows exactly on a line: gap n = 1000. At eps = 0.056 the shift ~990 leaves g_low near
    # C^2 whenever the test passes, so the projector's noise is far above its eigenvalue 1.
    data, _ = near_subspace(1000, 20, 1, noise=0.0, seed=1)
    outs = [release("gap_perturbation", data, 1, 0.056, DELTA, seed) for seed in range(40)]
    passed = [out for out in outs if out.basis is not None]
    flags = [warned(out, 1) for out in passed]
    assert sum(flags) >= 15  # 21 of 22 passes at these seeds
    strong = release("gap_perturbation", data, 1, 2.0, DELTA, 3)
    assert not warned(strong, 1)


@pytest.mark.parametrize("delta", [DELTA, 0.0])
def test_smooth_sensitivity_warns_on_no_gap_and_not_on_a_strong_spike(delta: float) -> None:
    noise_only = release("smooth_sensitivity", isotropic(2000, 50, seed=2), 2, 0.5, delta, 4)
    assert warned(noise_only, 2)
    data, _ = near_subspace(20_000, 50, 2, noise=0.0, seed=3)
    assert not warned(release("smooth_sensitivity", data, 2, 1.0, delta, 5), 2)


def test_the_smooth_rule_reads_the_noisy_matrix_only() -> None:
    rng = np.random.default_rng(6)
    d, k = 200, 3
    signal, _ = np.linalg.qr(rng.standard_normal((d, k)))
    assert noisy_basis_stands_out(signal + rng.normal(0.0, 0.01, (d, k)), "gaussian")
    assert not noisy_basis_stands_out(signal + rng.normal(0.0, 0.5, (d, k)), "gaussian")
    assert noisy_basis_stands_out(signal + 0.001 * rng.standard_cauchy((d, k)), "cauchy")
    assert not noisy_basis_stands_out(signal + 0.5 * rng.standard_cauchy((d, k)), "cauchy")
    assert not noisy_basis_stands_out(np.full((d, k), np.inf), "gaussian")


def test_histogram_aggregate_warns_for_a_cell_wider_than_the_points() -> None:
    # A given cell width far above the points' size puts every point in one cell: its centre
    # is a grid point, not the subspace.
    data = isotropic(20_000, 10, seed=7)
    out = release("histogram_aggregate", data, 1, 1.0, DELTA, 8, {"cell_width": 100.0})
    assert warned(out, 1)
    near, _ = near_subspace(20_000, 10, 1, noise=0.0, seed=9)
    good = release("histogram_aggregate", near, 1, 1.0, DELTA, 10)
    assert not warned(good, 1)


def test_continual_gauss_warns_on_noise_and_not_on_a_spike() -> None:
    tiny = 0.01 * isotropic(500, 30, seed=11)
    assert warned(release("continual_gauss", tiny, 2, 0.1, DELTA, 12, {"horizon": 4}), 2)
    data, _ = near_subspace(20_000, 30, 2, noise=0.0, seed=13)
    assert not warned(release("continual_gauss", data, 2, 1.0, DELTA, 14, {"horizon": 4}), 2)


def test_auto_passes_its_choices_warning_through() -> None:
    tiny = 0.01 * isotropic(2000, 50, seed=15)
    out = release("auto", tiny, 3, 0.1, DELTA, 16)
    assert out.extras["auto_choice"] == "analyze_gauss" and warned(out, 3)
    data, _ = near_subspace(20_000, 20, 2, noise=0.05, seed=17)
    strong = release("auto", data, 2, 1.0, DELTA, 18, {"structure_share": 0.0})
    assert not warned(strong, 2)
