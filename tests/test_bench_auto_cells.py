"""``bench_auto_cells``'s seeds: the candidates' noise does not reuse the data seed's stream, so
one unlucky draw (auto's count missing, an ``ALPHA`` event) does not repeat in every cell of a
seed (before 29 Nov 2026 ``release`` ran on ``default_rng(seed)``, the data seed itself)."""

from __future__ import annotations

import numpy as np

from bench.bench_auto_cells import noise_rng


def test_noise_is_reproducible_and_independent_of_the_data_seed_and_the_other_cells() -> None:
    def draw(rng: np.random.Generator) -> float:
        return float(rng.laplace())

    first = draw(noise_rng("near_0.01", 1000, 20_000, 0.3, 1))
    assert first == draw(noise_rng("near_0.01", 1000, 20_000, 0.3, 1))
    assert first != draw(np.random.default_rng(1))
    others = [
        noise_rng("near_0.001", 1000, 20_000, 0.3, 1),
        noise_rng("near_0.01", 300, 20_000, 0.3, 1),
        noise_rng("near_0.01", 1000, 20_000, 1.0, 1),
        noise_rng("near_0.01", 1000, 20_000, 0.3, 2),
    ]
    assert len({first, *map(draw, others)}) == 5
