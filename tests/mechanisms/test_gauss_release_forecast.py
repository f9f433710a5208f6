"""The forecast from an earlier release's figures (service/mechanisms/gauss_release_forecast.py):
the model's figure moves with the new request's noise and ``k`` as a release would. Its range
(:func:`range_from_release`) is tested in the ``test_forecast_*`` files beside this one."""

from __future__ import annotations

from service.mechanisms.forecast_figures import ReleasedFigures
from service.mechanisms.gauss_release_forecast import forecast_from_release


def test_the_forecast_from_a_release_moves_with_the_noise() -> None:
    figures = ReleasedFigures(
        ratios=(0.4, 0.2), interval=(0.5, 0.7), eigenvalues=(100.0, 40.0), trace=200.0,
        sigma=1.0, n_cols=25,
    )  # fmt: skip
    same = forecast_from_release(figures, 2, 1.0)
    assert same <= 0.6 + 1e-12
    assert forecast_from_release(figures, 2, 0.5) > same > forecast_from_release(figures, 2, 2.0)
    assert forecast_from_release(figures, 1, 1.0) < same
    # Far more noise: every component below the edge keeps nothing.
    assert forecast_from_release(figures, 2, 100.0) == 0.0
    assert ReleasedFigures.from_extras({"eigenvalues": [1.0]}, 25) is None
