"""Each mechanism's declared steps match its calibration: the costs the ledger charges in the
gaussian and zcdp currencies come from the very sigmas and shares ``run`` uses."""

from __future__ import annotations

import math
from decimal import Decimal

import numpy as np
import pytest

from service import accounting
from service.mechanisms.analyze_gauss import AnalyzeGauss, noise_sigma
from service.mechanisms.base import (
    ApproximateStep,
    GaussianStep,
    Mechanism,
    PublicContext,
    PureStep,
    ReleaseSpec,
    gaussian_test_event_delta,
    laplace_test_step,
)
from service.mechanisms.continual_gauss import ContinualGauss, tree_sensitivity
from service.mechanisms.friendly_aggregate import FriendlyAggregate, GdpSplit, release_split
from service.mechanisms.gap_perturbation import GapPerturbation
from service.mechanisms.histogram_aggregate import HistogramAggregate
from service.mechanisms.noise import analytic_gaussian_sigma
from service.mechanisms.registry import MECHANISMS
from service.mechanisms.spectrum import Spectrum, noise_std
from service.mechanisms.width_selection import search_split

CTX = PublicContext(n_rows=5000, n_cols=20, row_norm_bound=2.0)


def spec_for(mechanism, epsilon: float, delta: float, k: int = 3, **params):
    resolved = mechanism.prepare(CTX, k, epsilon, delta, mechanism.parse_params(params))
    return ReleaseSpec(k=k, epsilon=epsilon, delta=delta, params=resolved)


def test_analyze_gauss_steps_are_gaussian_and_sigma_round_trips_through_rho():
    mechanism = AnalyzeGauss()
    spec = spec_for(mechanism, 0.7, 1e-6)
    steps = mechanism.privacy_steps(CTX, spec)
    gram, variance = steps
    d = math.sqrt(2.0) * 4.0  # sqrt(2) C^2 at C = 2
    # The Gram step's sigma is the one the preview states (and run draws).
    assert gram == GaussianStep(d, mechanism.preview(CTX, spec).scales["sigma"])
    assert variance.sensitivity == d and variance.sigma > gram.sigma
    # Together exactly the request's (epsilon, delta) as one Gaussian: mu of the analytic sigma.
    mu2 = sum((step.sensitivity / step.sigma) ** 2 for step in steps)
    assert math.sqrt(mu2) == pytest.approx(d / noise_sigma(2.0, 0.7, 1e-6), rel=1e-8)
    costs = accounting.step_costs(steps)
    rho = float(costs.rho)
    assert rho == pytest.approx(mu2 / 2, rel=1e-12)
    # sigma from rho and back: a single Gaussian with rho = D^2/(2 sigma^2).
    assert d / math.sqrt(2.0 * rho) == pytest.approx(d / math.sqrt(mu2), rel=1e-12)
    assert costs.gaussian and costs.delta == 0


def test_centring_and_the_clip_quantile_compose_as_gaussians():
    mechanism = AnalyzeGauss()
    spec = spec_for(mechanism, 1.0, 1e-6, center="private", center_share=0.25, clip_quantile=0.9)
    steps = mechanism.privacy_steps(CTX, spec)
    # With a private centre the clip quantile's step is the centring probe (issue 24 item 2):
    # two histograms, sensitivity 2, drawn first; the same share of mu^2.
    counts, mean, _, _ = steps
    assert mean.sensitivity == pytest.approx(2 * 2.0 / 5000)
    assert counts.sensitivity == pytest.approx(2.0)
    assert (counts.sensitivity / counts.sigma) ** 2 == pytest.approx(
        0.05 * (mean.sensitivity / mean.sigma) ** 2 / 0.25
    )
    steps = [mean, counts, *steps[2:]]
    mus = [step.sensitivity / step.sigma for step in steps]
    total = math.sqrt(sum(mu**2 for mu in mus))
    assert total == pytest.approx(math.sqrt(2.0) * 4.0 / noise_sigma(2.0, 1.0, 1e-6), rel=1e-8)
    assert (mus[0] / total) ** 2 == pytest.approx(0.25)  # center_share is a share of mu^2
    assert float(accounting.step_costs(steps).rho) == pytest.approx(total**2 / 2, rel=1e-12)


def test_spectrum_and_continual_gauss_declare_their_noise():
    spectrum = Spectrum()
    spec = spec_for(spectrum, 0.5, 1e-7)
    assert spectrum.privacy_steps(CTX, spec) == [
        GaussianStep(math.sqrt(2.0) * 4.0, noise_std(2.0, 0.5, 1e-7))
    ]
    continual = ContinualGauss()
    spec = spec_for(continual, 0.5, 1e-7, horizon=8)
    (step,) = continual.privacy_steps(CTX, spec)
    # The whole tree: sqrt(L) sqrt(2) C^2 with L = log2(8) + 1 = 4 levels.
    assert step.sensitivity == tree_sensitivity(2.0, 8) == pytest.approx(2 * math.sqrt(2) * 4)


def test_gap_perturbation_is_approximate_zcdp():
    mechanism = GapPerturbation()
    spec = spec_for(mechanism, 1.0, 1e-6)
    steps = mechanism.privacy_steps(CTX, spec)
    # The test through the common event g_low <= min(g, g'): e^eps1 delta1, eps1 plus the
    # renormalisation (laplace_test_step).
    spill = math.exp(0.5) * 0.5e-6
    assert steps == [
        ApproximateStep(0.5 - math.log1p(-spill), spill),
        GaussianStep(1.0, analytic_gaussian_sigma(1.0, 0.5, 0.5e-6)),
    ]
    costs = accounting.step_costs(steps)
    # The double spill is charged exactly as the double it is, rounded up.
    assert costs.delta == accounting.round_up(Decimal(spill)) and not costs.gaussian


@pytest.mark.parametrize("radius", [None, 0.5])
def test_friendly_aggregate_steps_follow_its_split(radius):
    mechanism = FriendlyAggregate()
    spec = spec_for(mechanism, 1.0, 1e-6, k=2, radius=radius)
    steps = mechanism.privacy_steps(CTX, spec)
    split = release_split(1.0, 1e-6, radius is not None, t=spec.params.t)
    assert (split.eps0 > 0) == (radius is None)
    assert any(isinstance(step, PureStep) for step in steps) == (radius is None)
    approximate = [step for step in steps if isinstance(step, ApproximateStep)]
    if isinstance(split, GdpSplit):
        expected = gaussian_test_event_delta(split.ptr_mu, split.delta1)
    else:
        expected = math.exp(split.eps1) * split.delta1
    assert [step.delta for step in approximate] == [expected]
    assert isinstance(steps[-1], GaussianStep)


def test_every_declared_profile_matches_the_admitted_accountings():
    for mechanism in MECHANISMS.values():
        if "gaussian" in mechanism.accountings:
            assert "zcdp" in mechanism.accountings, mechanism.name
        if mechanism.accountings == frozenset({"basic"}) or mechanism.name == "auto":
            continue  # auto never runs itself under a filter (releases.admitted_choice)
        assert type(mechanism).privacy_steps is not Mechanism.privacy_steps, mechanism.name


@pytest.mark.parametrize("width", [None, 0.5])
def test_histogram_aggregate_is_the_search_and_an_approximate_histogram(width):
    mechanism = HistogramAggregate()
    spec = spec_for(mechanism, 1.0, 1e-6, k=2, cell_width=width)
    steps = mechanism.privacy_steps(CTX, spec)
    if width is None:
        eps0, eps_h = search_split(1.0)
        assert steps == [PureStep(eps0), ApproximateStep(eps_h, 1e-6)]
    else:
        assert steps == [ApproximateStep(1.0, 1e-6)]


@pytest.mark.parametrize(("epsilon", "delta"), [(0.1, 1e-9), (0.5, 1e-6), (2.0, 1e-3)])
def test_laplace_test_step_against_the_laplace_laws(epsilon, delta):
    """The common event ``I = {L <= min(S, S')}`` of a Laplace PTR test, checked against
    scipy's Laplace law for the worst shift ``|S - S'| = D``: each side's mass outside ``I``
    is at most the declared delta, and on ``I`` the renormalised densities' ratio is at most
    ``e^eps'`` at every point of a grid."""
    from scipy.stats import laplace

    step = laplace_test_step(epsilon, delta)
    assert step is not None
    sensitivity = 2.0
    scale = sensitivity / epsilon
    shift = scale * math.log(1.0 / (2.0 * delta))  # P[L > S] = delta
    s_low, s_high = 0.0, sensitivity  # S(x), S(x')
    low = laplace(loc=s_low - shift, scale=scale)
    high = laplace(loc=s_high - shift, scale=scale)
    top = min(s_low, s_high)
    outside = (low.sf(top), high.sf(top))
    assert max(outside) <= step.delta * (1 + 1e-9)
    grid = np.linspace(top - 40 * scale, top, 2001)
    ratio = (low.pdf(grid) / low.cdf(top)) / (high.pdf(grid) / high.cdf(top))
    bound = math.exp(step.epsilon) * (1 + 1e-9)
    assert np.all(ratio <= bound) and np.all(1 / ratio <= bound)
    # The per-side events would not do: the high side has mass above the low side's S.
    assert high.sf(s_low) > 0


def test_laplace_test_step_refuses_a_useless_profile():
    assert laplace_test_step(10.0, 1e-4) is None


@pytest.mark.parametrize(("mu", "delta"), [(0.1, 1e-7), (0.5, 1e-6), (1.5, 1e-3)])
def test_gaussian_test_event_against_truncated_gaussians(mu, delta):
    """F3's Gaussian PTR test on the common event ``I = {L <= min(S, S')}``: the mass outside
    it is the declared delta (scipy), and the Renyi divergence of the two truncated laws,
    integrated numerically in both directions at several orders, stays within ``alpha
    mu^2/2`` (the log-concavity argument in the docstring)."""
    from scipy import integrate
    from scipy.stats import norm

    declared = gaussian_test_event_delta(mu, delta)
    s = 1.0
    z = norm.isf(delta)
    means = (0.0 - s * z, mu * s - s * z)  # S = 0 and S' = D = mu s, shifted by s z
    top = 0.0  # min(S, S')
    masses = [norm.cdf(top, loc=m, scale=s) for m in means]
    assert max(1 - mass for mass in masses) <= declared * (1 + 1e-9)
    assert declared >= delta
    for alpha in (1.01, 1.5, 2.0, 8.0):
        for a, b, pa, pb in ((0, 1, masses[0], masses[1]), (1, 0, masses[1], masses[0])):

            def integrand(y, a=a, b=b, pa=pa, pb=pb, alpha=alpha):
                log_p = norm.logpdf(y, loc=means[a], scale=s) - math.log(pa)
                log_q = norm.logpdf(y, loc=means[b], scale=s) - math.log(pb)
                return math.exp(alpha * log_p + (1 - alpha) * log_q)

            lowest = min(means) - 40.0 * s
            value, _ = integrate.quad(integrand, lowest, top, limit=400, epsabs=0, epsrel=1e-12)
            divergence = math.log(value) / (alpha - 1)
            assert divergence <= alpha * mu**2 / 2 * (1 + 1e-6) + 1e-12
