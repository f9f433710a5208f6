"""friendly_aggregate: basic accounting against derivation F3's (issue 16 item 2, zCDP variant).

Prints one Markdown table (public calibration only, no data): for ``eps in {0.1, 0.3, 1, 3}``,
``delta = 1e-6``, ``k = 3``, ``d = 50`` (projection aggregator) and ``n in {5,000, 50,000}``, with
``t`` from the current ``choose_t``:

* ``t_min`` (the least ``t`` whose test can pass on all-agreeing subsets);
* the mean's noise ``sigma`` per unit radius on all-agreeing subsets (``agreeing_noise``: the
  median ``W_low = t - shift``);
* the probability that the test ends in no result on all-agreeing subsets;

under four accountings:

* ``basic``: today's (M6 + F1 + F2): AboveThreshold ``eps0``, Laplace test ``(eps1, delta1)``,
  analytic Gaussian ``(eps2, delta2)``, summed;
* ``tight-Laplace``: the same three steps and shares, the mean's Gaussian given the largest
  ``mu2`` for which the exact composition (randomized response ``eps0`` x Laplace ``eps1`` x
  Gaussian ``mu2``) stays within ``(eps, delta - delta1)``; test and ``t_min`` unchanged;
* ``gdp`` (F3): Gaussian test and mean, exact composition with the ``eps0``-DP search;
* ``zCDP-CKS``: the seed's accounting (Bun-Steinke zCDP, ``eps0``-DP as ``eps0^2/2``, Canonne-
  Kamath-Steinke conversion) with Gaussian test and mean; the search gets a quarter of
  ``rho`` (``eps0 = sqrt(rho/2)``): ``eps/4`` pure would alone exceed the whole ``rho`` at
  ``eps <= 1``.

    PYTHONPATH=. .venv/bin/python bench/experiments/bench_friendly_zcdp.py
"""

from __future__ import annotations

import math

from service.config import Settings
from service.mechanisms import friendly_aggregate as fa
from service.mechanisms.composition import cks_delta, largest_mean_mu

EPSILONS = (0.1, 0.3, 1.0, 3.0)
NS = (5_000, 50_000)
DELTA, K, D = 1e-6, 3, 50


def cks_rho(epsilon: float, delta: float) -> float:
    """The largest ``rho`` whose CKS conversion gives ``(epsilon, delta)`` (bisection)."""
    low, high = 0.0, epsilon
    for _ in range(80):
        mid = 0.5 * (low + high)
        if cks_delta(mid, epsilon) <= delta:
            low = mid
        else:
            high = mid
    return low


def cks_split(epsilon: float, delta: float, t: int) -> fa.GdpSplit:
    """The zCDP-CKS variant: ``delta1 = delta/2``, ``rho`` at ``delta/2``, a quarter of it for
    the search, the rest ``mu^2/2``; the test's share by F3's rule."""
    delta1 = delta / 2
    rho = cks_rho(epsilon, delta - delta1)
    eps0 = math.sqrt(rho / 2)
    mu = math.sqrt(1.5 * rho)
    best: fa.GdpSplit | None = None
    best_noise = math.inf
    for fraction in fa.GDP_FRACTIONS:
        split = fa.GdpSplit(
            eps0, delta1, mu * math.sqrt(fraction), mu * math.sqrt(1 - fraction), fraction
        )
        if fa.split_no_result_if_agreeing(t, split) > fa.COMFORTABLE_NO_RESULT:
            continue
        noise = fa.agreeing_noise(t, split)
        if noise < best_noise:
            best, best_noise = split, noise
    if best is None:
        mu1 = mu * math.sqrt(fa.GDP_FRACTIONS[-1])
        best = fa.GdpSplit(eps0, delta1, mu1, mu * math.sqrt(0.05), fa.GDP_FRACTIONS[-1])
    return best


def cks_t_min(epsilon: float, delta: float) -> int:
    split = cks_split(epsilon, delta, 3)  # the largest fraction
    return fa._smallest_t(lambda t: fa.split_margin(t, split) >= 0.0)


def tight_laplace_noise(t: int, split: fa.BudgetSplit, epsilon: float, delta: float) -> float:
    """``agreeing_noise`` with the mean's ``sigma = D/mu2`` for the exact composition's ``mu2``
    (same ``eps0``, ``eps1``, ``delta1``)."""
    b = fa.ramp_width(t)
    sens = fa.weight_sensitivity(t, b)
    w_low = float(t) - fa.split_shift(split, sens)
    if w_low < fa.weight_floor(sens):
        return math.inf
    mu2 = largest_mean_mu(epsilon, delta, split.eps0, split.eps1, split.delta1)
    return fa.mean_sensitivity(1.0, t, b, w_low) / mu2


def fmt(x: float) -> str:
    if math.isinf(x):
        return "inf"
    return f"{x:.3g}"


def release_sigma(t: int, split: fa.AnySplit) -> float:
    """``sigma`` per unit radius at the searched release's typical weight, ignoring the
    no-result cap of ``release_noise`` (reported apart)."""
    b = fa.ramp_width(t)
    sens = fa.weight_sensitivity(t, b)
    w_low = fa.release_weight(t, split, False) - fa.split_shift(split, sens)
    if w_low < fa.weight_floor(sens):
        return math.inf
    return fa.split_mean_sigma(fa.mean_sensitivity(1.0, t, b, w_low), split)


def main() -> None:
    memory = int(Settings().worker_memory_mb * 2**20)
    print(
        f"delta = {DELTA:g}, k = {K}, d = {D} (projection), radius searched; t from choose_t. "
        "sigma: the mean's noise per unit radius at the median W_low, with W = t (all subsets "
        "agree) and with W = the search threshold (where a searched release typically "
        "stops); no-result: the test's failure probability at W = t. gdp = F3's "
        "Gaussian-test split (its best test share); chosen = what release_split picks under "
        "ACCOUNTING = gdp\n"
    )
    print(
        "| eps | n | t | t_min basic / gdp / zCDP-CKS | sigma at W = t: basic / tight-Laplace / "
        "gdp / zCDP-CKS | basic / gdp | sigma at the threshold: basic / gdp | "
        "no-result at W = t: basic / gdp / zCDP-CKS | gdp test share | chosen | "
        "search eps0 basic = gdp / zCDP-CKS |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for eps in EPSILONS:
        t_mins = (
            fa.t_min_for(eps, DELTA, False, accounting="basic"),
            fa.gdp_t_min(eps, DELTA, False),
            cks_t_min(eps, DELTA),
        )
        for n in NS:
            choice = fa.choose_t(n, D, K, eps, DELTA, None, "projection", None, memory)
            t = max(3, choice.t)
            basic = fa.release_split(eps, DELTA, False, t=t, accounting="basic")
            assert isinstance(basic, fa.BudgetSplit)
            gdp = fa.gdp_budget_split(eps, DELTA, False, t=t)
            chosen = fa.release_split(eps, DELTA, False, t=t, accounting="gdp")
            cks = cks_split(eps, DELTA, t)
            sig = (
                fa.agreeing_noise(t, basic),
                tight_laplace_noise(t, basic, eps, DELTA),
                fa.agreeing_noise(t, gdp),
                fa.agreeing_noise(t, cks),
            )
            at_threshold = (release_sigma(t, basic), release_sigma(t, gdp))
            fail = (
                fa.split_no_result_if_agreeing(t, basic),
                fa.split_no_result_if_agreeing(t, gdp),
                fa.split_no_result_if_agreeing(t, cks),
            )
            ratio = f"{sig[0] / sig[2]:.2f}" if math.isfinite(sig[0] / sig[2]) else "-"
            shown_t = f"{t:,}" if t >= min(t_mins) else f"{t} (rows cap)"
            print(
                f"| {eps:g} | {n:,} | {shown_t} | {' / '.join(f'{x:,}' for x in t_mins)} | "
                f"{' / '.join(fmt(x) for x in sig)} | {ratio} | "
                f"{' / '.join(fmt(x) for x in at_threshold)} | "
                f"{' / '.join(f'{x:.2g}' for x in fail)} | {gdp.fraction:g} | "
                f"{'gdp' if isinstance(chosen, fa.GdpSplit) else 'basic'} | "
                f"{gdp.eps0:.3g} / {cks.eps0:.3g} |"
            )


if __name__ == "__main__":
    main()
