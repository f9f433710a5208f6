"""The noise a person-level release actually draws is the one ALGORITHMS.md gives ("Privacy
unit": a person bounded to ``||G_p||_F <= C^2`` moves the Gram, the eigenvalue vector and each
tree level by at most one row's ``sqrt(2) C^2``), not a per-row figure scaled by rows per person
or a smaller one. Recorded through the real app and worker: the ``sigma`` handed to the
symmetric Gaussian matrix (analyze_gauss, each continual node) and the scale of the eigenvalue
noise (spectrum), on a dataset whose one person holds most rows, against the same request on
the same rows at row level and against the formula."""

from __future__ import annotations

import math

import numpy as np
import pytest

from service.mechanisms import analyze_gauss, continual_gauss, spectrum
from service.mechanisms.noise import analytic_gaussian_sigma
from tests.conftest import bearer, fetch_release, npy_bytes

N, D, C = 300, 4, 2.0
EPS, DELTA = 1.0, 1e-5


@pytest.fixture
def drawn(monkeypatch):
    """Every scale drawn, by mechanism: the symmetric matrices' sigma and spectrum's normal."""
    seen: dict[str, list[float]] = {"gram": [], "continual": [], "spectrum": []}

    def recording(name, original):
        def draw(size, sigma, rng):
            seen[name].append(float(sigma))
            return original(size, sigma, rng)

        return draw

    monkeypatch.setattr(
        analyze_gauss, "symmetric_gaussian", recording("gram", analyze_gauss.symmetric_gaussian)
    )
    monkeypatch.setattr(
        continual_gauss,
        "symmetric_gaussian",
        recording("continual", continual_gauss.symmetric_gaussian),
    )
    original = spectrum.analytic_gaussian_sigma

    def spectrum_sigma(sensitivity, epsilon, delta):
        sigma = original(sensitivity, epsilon, delta)
        seen["spectrum"].append(float(sigma))
        return sigma

    monkeypatch.setattr(spectrum, "analytic_gaussian_sigma", spectrum_sigma)
    return seen


def rows() -> np.ndarray:
    rng = np.random.default_rng(7)
    data = rng.normal(size=(N, D))
    return data / np.linalg.norm(data, axis=1, keepdims=True) * 3.0  # every row clipped


def dataset(client, keys, person: bool) -> str:
    data = rows()
    if person:
        ids = np.arange(N, dtype=np.float64)
        ids[: N - 50] = 1.0  # one person with 250 rows
        data = np.column_stack([ids, data])
    form = {"name": "noise", "epsilon_budget": "100", "delta_budget": "0.001",
            "row_norm_bound": str(C), "accounting": "basic"}  # fmt: skip
    if person:
        form["privacy_unit_column"] = "0"
    response = client.post(
        "/v1/datasets",
        headers=bearer(keys.owner),
        files={"file": ("x.npy", npy_bytes(data), "application/octet-stream")},
        data=form,
    )
    assert response.status_code == 201, response.text
    return str(response.json()["id"])


def release(client, keys, run_worker, dataset_id, mechanism, **params) -> None:
    response = client.post(
        f"/v1/datasets/{dataset_id}/releases",
        headers=bearer(keys.analyst),
        json={"mechanism": mechanism, "k": 2, "epsilon": str(EPS), "delta": str(DELTA),
              "params": params},
    )  # fmt: skip
    assert response.status_code == 202, response.text
    assert run_worker() == 1
    shown = fetch_release(client, keys.owner, response.json()["id"])
    assert shown["status"] in {"succeeded", "running"}, shown


@pytest.mark.parametrize(
    ("mechanism", "params", "kind"),
    [
        ("analyze_gauss", {}, "gram"),
        ("spectrum", {}, "spectrum"),
        ("continual_gauss", {"horizon": 4}, "continual"),
    ],
)
def test_person_level_draws_the_row_level_noise_of_algorithms_md(
    client, keys, run_worker, drawn, mechanism, params, kind
) -> None:
    scales = {}
    for person in (False, True):
        dataset_id = dataset(client, keys, person)
        drawn[kind].clear()
        release(client, keys, run_worker, dataset_id, mechanism, **params)
        assert drawn[kind], (mechanism, person)
        scales[person] = list(drawn[kind])
    assert scales[True] == scales[False]
    whole = analytic_gaussian_sigma(math.sqrt(2) * C * C, EPS, DELTA)
    if kind == "continual":
        # sqrt(L) sqrt(2) C^2, L = ceil(log2 T) + 1 levels, the whole (eps, delta) once.
        levels = math.ceil(math.log2(params["horizon"])) + 1
        expected = analytic_gaussian_sigma(math.sqrt(levels) * math.sqrt(2) * C * C, EPS, DELTA)
        assert scales[True][0] == pytest.approx(expected, rel=1e-9)
    elif kind == "spectrum":
        assert scales[True][-1] == pytest.approx(whole, rel=1e-9)
    else:
        # The Gram's share of the budget: never below the whole budget's sigma.
        assert scales[True][0] >= whole * (1 - 1e-12)
