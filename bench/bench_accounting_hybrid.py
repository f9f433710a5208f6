"""Issue 31, item 5: the noise per release of the "either of three filters" rule
(``service.accounting.HybridState``: ``gaussian`` on ``delta_A``, ``zcdp`` on ``delta_B``,
``basic`` on ``delta_C``) against ``basic``, the two single filters and the PLD accountant
(``dp-accounting``), at N = 1, 10, 100 releases.

    PYTHONPATH=.:clients/python .venv/bin/python bench/bench_accounting_hybrid.py [--quick]

Per release, sensitivity 1 (the ratios are the same for every Gaussian step):

* **Gaussian-only**: N equal Gaussian releases; the figure is each release's ``sigma``.
  ``basic``: the analytic Gaussian at ``(eps/N, delta/N)``. ``pld``: the smallest ``sigma``
  whose N-fold composition dp-accounting's PLD accountant finds within ``(eps, delta)`` (an
  accountant, not a filter: the bar). ``gaussian``/``zcdp``: the single filters on the whole
  delta (``zcdp`` with half for the conversion, today's default). ``hybrid``: the best filter
  of the three at the default shares (the smallest ``sigma`` one of them admits N times).
* **Mixed**: N/2 Gaussian releases and N/2 pure releases of ``eps_p = mu`` (as an aggregator's
  AboveThreshold or Laplace steps; the same zCDP cost as the Gaussian of ``mu``); the figure is
  the Gaussian releases' ``sigma = 1/mu``. ``pld`` composes dp-accounting's pure-DP and
  Gaussian PLDs. ``gaussian`` refuses (pure steps). N = 2, 10, 100.
* **Pure-only**: N equal pure releases; the figure is each one's Laplace scale ``1/eps_p``.

Writes ``bench/results/accounting_hybrid.md`` and its section of docs/benchmarks.md. No timing.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Callable
from decimal import Decimal
from pathlib import Path

from dp_accounting.pld import common as pld_common
from dp_accounting.pld import privacy_loss_distribution as pld
from scipy.stats import norm

from bench.report import publish_section
from service import accounting
from service.mechanisms.noise import analytic_gaussian_sigma

ROOT = Path(__file__).resolve().parent.parent
RESULT = ROOT / "bench" / "results" / "accounting_hybrid.md"
START, END = "<!-- accounting-hybrid:start -->", "<!-- accounting-hybrid:end -->"

BUDGETS = (
    (Decimal(1), Decimal("1e-6")),
    (Decimal(8), Decimal("1e-6")),
    (Decimal("0.5"), Decimal("1e-3")),
)
GRID = 1e-4  # dp-accounting's value discretisation (pessimistic: its deltas are upper bounds)


def largest(fits: Callable[[float], bool], low: float, high: float) -> float:
    """The largest ``x`` in ``[low, high]`` with ``fits(x)`` (true below, false above), to
    1e-6 relative."""
    for _ in range(60):
        mid = math.sqrt(low * high)
        if fits(mid):
            low = mid
        else:
            high = mid
        if high / low < 1 + 1e-6:
            break
    return low


def gauss_pld(mu: float, count: int) -> pld.PrivacyLossDistribution:
    one = pld.from_gaussian_mechanism(1.0 / mu, sensitivity=1.0, value_discretization_interval=GRID)
    return one.self_compose(count) if count > 1 else one


def pure_pld(epsilon: float, count: int) -> pld.PrivacyLossDistribution:
    one = pld.from_privacy_parameters(
        pld_common.DifferentialPrivacyParameters(epsilon, 0.0), value_discretization_interval=GRID
    )
    return one.self_compose(count) if count > 1 else one


def basic_gauss_epsilon(mu: float, delta: float) -> float:
    """The smallest epsilon at which a ``mu``-GDP release is ``(epsilon, delta)``-DP."""
    return float(accounting.gdp_epsilon(Decimal(repr(mu)), Decimal(repr(delta))))


class Budget:
    """The figures of one ``(epsilon, delta)`` under each rule."""

    def __init__(self, epsilon: Decimal, delta: Decimal) -> None:
        self.epsilon, self.delta = epsilon, delta
        self.eps, self.dlt = float(epsilon), float(delta)
        self.mu_full = float(accounting.mu_budget(epsilon, delta))
        self.rho_zcdp = float(accounting.rho_budget(epsilon, delta / 2))
        self.hybrid = accounting.hybrid_budget(epsilon, delta)
        self.mu_a = float(self.hybrid.mu_total)
        self.rho_b = float(self.hybrid.rho_total)
        self.delta_c = float(self.hybrid.delta_basic)

    # -- Gaussian-only: sigma per release
    def gauss(self, n: int) -> dict[str, float]:
        basic = analytic_gaussian_sigma(1.0, self.eps / n, self.dlt / n)
        pld_sigma = 1.0 / largest(
            lambda mu: gauss_pld(mu, n).get_delta_for_epsilon(self.eps) <= self.dlt, 1e-4, 50.0
        )
        c = analytic_gaussian_sigma(1.0, self.eps / n, self.delta_c / n)
        return {
            "basic": basic,
            "pld": pld_sigma,
            "gaussian": math.sqrt(n) / self.mu_full,
            "zcdp": math.sqrt(n / (2 * self.rho_zcdp)),
            "hybrid": min(math.sqrt(n) / self.mu_a, math.sqrt(n / (2 * self.rho_b)), c),
        }

    # -- Mixed: n/2 Gaussian (mu) + n/2 pure (eps_p = mu); sigma = 1/mu of the Gaussian ones
    def basic_mixed(self, half: int, delta: float) -> float:
        def fits(mu: float) -> bool:
            return half * (mu + basic_gauss_epsilon(mu, delta / half)) <= self.eps

        return 1.0 / largest(fits, 1e-5, 50.0)

    def a_prime_mixed(self, half: int) -> float:
        """A' (GDP, pure steps at ``pure_mu``): the largest Gaussian ``mu`` with ``half (mu^2 +
        pure_mu(mu)^2) <= mu_A^2`` (the pure releases' epsilon equals the Gaussian's mu)."""
        return 1.0 / largest(
            lambda mu: half * (mu**2 + _pure_mu(mu) ** 2) <= self.mu_a**2, 1e-6, 50.0
        )

    def mixed(self, n: int) -> dict[str, float]:
        half = n // 2

        def pld_fits(mu: float) -> bool:
            composed = gauss_pld(mu, half).compose(pure_pld(mu, half))
            return bool(composed.get_delta_for_epsilon(self.eps) <= self.dlt)

        return {
            "basic": self.basic_mixed(half, self.dlt),
            "pld": 1.0 / largest(pld_fits, 1e-4, 50.0),
            "zcdp": math.sqrt(n / (2 * self.rho_zcdp)),
            "hybrid": min(
                self.a_prime_mixed(half),
                math.sqrt(n / (2 * self.rho_b)),
                self.basic_mixed(half, self.delta_c),
            ),
        }

    # -- Pure-only: Laplace scale 1/eps_p per release
    def pure(self, n: int) -> dict[str, float]:
        pld_eps = largest(
            lambda e: pure_pld(e, n).get_delta_for_epsilon(self.eps) <= self.dlt, 1e-5, 50.0
        )
        return {
            "basic": n / self.eps,
            "pld": 1.0 / pld_eps,
            "zcdp": 1.0 / math.sqrt(2 * self.rho_zcdp / n),
            "hybrid": min(
                n / self.eps,
                1.0 / math.sqrt(2 * self.rho_b / n),
                1.0 / _pure_epsilon_of_mu(self.mu_a / math.sqrt(n)),
            ),
        }


def _pure_mu(epsilon: float) -> float:
    """``-2 Phi^-1(1/(1+e^eps))``: the GDP ``mu`` of an ``eps``-DP step (``accounting.pure_mu``
    in doubles)."""
    return float(-2 * norm.ppf(1 / (1 + math.exp(epsilon))))


def _pure_epsilon_of_mu(mu: float) -> float:
    """The inverse of :func:`_pure_mu`."""
    return math.log(1 / float(norm.cdf(-mu / 2)) - 1)


def row(label: str, n: int, figures: dict[str, float], kinds: tuple[str, ...]) -> str:
    pld_value = figures["pld"]
    cells = [label, str(n)]
    for kind in kinds:
        value = figures.get(kind)
        if value is None:
            cells.append("refused")
            continue
        cells.append(f"{value:.4g} ({value / pld_value:.3f})")
    cells.append(f"{figures['hybrid'] / figures['basic']:.3f}")
    return "| " + " | ".join(cells) + " |"


def table(quick: bool) -> str:
    kinds = ("pld", "basic", "gaussian", "zcdp", "hybrid")
    shares = accounting.DEFAULT_HYBRID_SHARES
    lines = [
        f"Default shares of delta: A' (GDP: Gaussian steps, pure steps at pure_mu) "
        f"{shares.gaussian}, B (zcdp) conversion "
        f"{shares.conversion} + steps {shares.mechanisms}, C (basic) {shares.basic}.",
        "",
        "| budget, sequence | N | "
        + " | ".join(f"{k} (/pld)" for k in kinds)
        + " | hybrid/basic |",
        "|---|---|" + "---|" * (len(kinds) + 1),
    ]
    for epsilon, delta in BUDGETS[:1] if quick else BUDGETS:
        budget = Budget(epsilon, delta)
        label = f"({epsilon}, {delta})"
        for n in (1, 10) if quick else (1, 10, 100):
            lines.append(row(f"{label} Gaussian sigma", n, budget.gauss(n), kinds))
            print(lines[-1], file=sys.stderr)
        for n in (2, 10) if quick else (2, 10, 100):
            lines.append(row(f"{label} mixed: Gaussian sigma", n, budget.mixed(n), kinds))
            print(lines[-1], file=sys.stderr)
        for n in (1, 10) if quick else (1, 10, 100):
            lines.append(row(f"{label} pure: Laplace scale", n, budget.pure(n), kinds))
            print(lines[-1], file=sys.stderr)
    return "\n".join(lines)


def section(body: str) -> str:
    return "\n".join(
        [
            START,
            "## Either of three filters (`bench/bench_accounting_hybrid.py`)",
            "",
            "Noise per release (sensitivity 1) and its ratio to the PLD accountant's (an "
            "accountant's figure for a fixed sequence, not a filter: the bar); last column "
            "hybrid over basic (<= 1.01 is the issue's bar). Mixed: N/2 Gaussian and N/2 pure "
            "releases of epsilon equal to the Gaussian's mu; gaussian refuses them.",
            "",
            body,
            "",
            END,
        ]
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="one budget, N <= 10; no files")
    args = parser.parse_args()
    body = table(args.quick)
    print(body)
    if not args.quick:
        publish_section(RESULT, START, END, section(body))


if __name__ == "__main__":
    main()
