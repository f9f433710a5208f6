"""Issue 31, item 5: which accounting could be the default? Every *sound* candidate rule (a union
of filters, each with its own fully adaptive theorem, ALGORITHMS.md "Either of two filters")
against ``basic`` and the PLD accountant (``dp-accounting``), per sequence of releases.

    PYTHONPATH=.:clients/python .venv/bin/python bench/bench_accounting_default.py [--quick]

The goal (issue 31, item 5): a default within 1% of ``basic``'s noise for every sequence (one
release included) and within 5% of the PLD accountant's for Gaussian releases at N = 10 and 100.
The shipped default, ``hybrid`` (``accounting.DEFAULT_HYBRID_SHARES``: A' 0.96, B 0.01 + 0.02,
C 0.01), has its own row, and a grid over eps in {0.1, 0.5, 1, 2, 8} x delta in {1e-8, 1e-6,
1e-5, 1e-3} checks the bars for Gaussian releases (one release against ``basic``, 10 and 100
against the PLD accountant).

Filters (each on its share of ``delta``; a rule admits a sequence iff one of its filters does):

* ``A``: the GDP filter on Gaussian steps only (Smith & Thakurta 2022), ``mu_B(eps, delta_A)``.
* ``A'``: the same filter also admitting pure ``eps``-DP steps as ``mu``-GDP with
  ``mu = -2 Phi^-1(1/(1 + e^eps))`` (``accounting.pure_mu``). Sound: Smith & Thakurta's theorem is
  for any adaptively chosen ``mu_i``-GDP mechanisms (they define GDP by simulation from
  ``N(0,1)`` / ``N(mu,1)``, which Blackwell's theorem gives for a curve above ``G_mu``), and
  ``eps``-DP's curve is above ``G_mu`` (the chords through the symmetric point).
* ``B``: the approximate-zCDP filter (Whitehouse et al. 2023), CKS conversion share + steps share.
* ``C``: ``basic`` (Rogers et al. 2016) on ``delta_C``; a Gaussian step is charged the
  analytic-Gaussian ``(eps_i, delta_i)`` that the rule splits optimally.

Sequences (sensitivity 1; the figure is the noise of each release, smaller is better):

* ``gauss N``: N equal Gaussian releases (sigma);
* ``mixed N``: N/2 Gaussian releases and N/2 pure releases of ``eps_p = mu`` (an aggregator's
  AboveThreshold / Laplace steps), the Gaussian ones' sigma;
* ``pure+gauss``: one pure release of ``eps/2`` (e.g. ``exact_gapmax``), then one Gaussian
  release with what remains (its sigma);
* ``pure N``: N equal pure releases (Laplace scale).

Deterministic (no timing). Writes ``bench/results/accounting_default.md`` and its section of
docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import math
import sys
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path

from scipy.stats import norm

from bench.bench_accounting_hybrid import (
    BUDGETS,
    basic_gauss_epsilon,
    gauss_pld,
    largest,
    pure_pld,
)
from bench.report import publish_section
from service import accounting
from service.mechanisms.noise import analytic_gaussian_sigma

ROOT = Path(__file__).resolve().parent.parent
RESULT = ROOT / "bench" / "results" / "accounting_default.md"
START, END = "<!-- accounting-default:start -->", "<!-- accounting-default:end -->"

REFUSED = math.inf


def pure_mu(epsilon: float) -> float:
    """``-2 Phi^-1(1/(1+e^eps))``: the GDP ``mu`` of an ``eps``-DP step (float, as a bench)."""
    return float(-2 * norm.ppf(1 / (1 + math.exp(epsilon))))


def pure_epsilon_of_mu(mu: float) -> float:
    """The inverse of :func:`pure_mu`: ``a = Phi(-mu/2) = 1/(1+e^eps)``."""
    return math.log(1 / float(norm.cdf(-mu / 2)) - 1)


@dataclass(frozen=True)
class Filter:
    """One filter of a rule: ``kind`` A, A', B or C, and its shares of delta (B: conversion,
    steps)."""

    kind: str
    share: float
    steps_share: float = 0.0


@dataclass(frozen=True)
class Rule:
    name: str
    filters: tuple[Filter, ...]


SHARES = accounting.DEFAULT_HYBRID_SHARES
SHIPPED = Rule(
    "hybrid (default)",
    (
        Filter("A'", float(SHARES.gaussian)),
        Filter("B", float(SHARES.conversion), float(SHARES.mechanisms)),
        Filter("C", float(SHARES.basic)),
    ),
)
ZCDP = Rule("zcdp", (Filter("B", 0.5, 0.5),))

RULES = (
    Rule("basic", (Filter("C", 1.0),)),
    SHIPPED,
    ZCDP,
    Rule("gaussian", (Filter("A", 1.0),)),
    Rule("A'", (Filter("A'", 1.0),)),
    Rule("A .95 + B .04 + C .01", (Filter("A", 0.95), Filter("B", 0.02, 0.02), Filter("C", 0.01))),
    Rule("A' .9 + B .1", (Filter("A'", 0.9), Filter("B", 0.05, 0.05))),
    Rule("A' .9 + C .1", (Filter("A'", 0.9), Filter("C", 0.1))),
    Rule("A' .5 + C .5", (Filter("A'", 0.5), Filter("C", 0.5))),
    Rule("A' .25 + C .75", (Filter("A'", 0.25), Filter("C", 0.75))),
    Rule("A' .1 + C .9", (Filter("A'", 0.1), Filter("C", 0.9))),
)

SEQUENCES = (
    ("gauss", 1),
    ("gauss", 10),
    ("gauss", 100),
    ("mixed", 2),
    ("mixed", 10),
    ("mixed", 100),
    ("pure+gauss", 2),
    ("pure", 1),
    ("pure", 10),
    ("pure", 100),
)


class Budget:
    """Every filter's figure for every sequence at one ``(epsilon, delta)``."""

    def __init__(self, epsilon: Decimal, delta: Decimal) -> None:
        self.epsilon, self.delta = epsilon, delta
        self.eps, self.dlt = float(epsilon), float(delta)

    def mu_b(self, share: float) -> float:
        return float(accounting.mu_budget(self.epsilon, self.delta * Decimal(repr(share))))

    def rho_b(self, share: float) -> float:
        return float(accounting.rho_budget(self.epsilon, self.delta * Decimal(repr(share))))

    # -- one filter, one sequence
    def figure(self, kind: str, n: int, f: Filter) -> float:
        if f.kind in ("A", "A'"):
            return self._gdp(kind, n, self.mu_b(f.share), f.kind == "A'")
        if f.kind == "B":
            return self._zcdp(kind, n, self.rho_b(f.share))
        return self._basic(kind, n, self.dlt * f.share)

    def _gdp(self, kind: str, n: int, mu_b: float, admits_pure: bool) -> float:
        if kind == "gauss":
            return math.sqrt(n) / mu_b
        if not admits_pure:
            return REFUSED
        if kind == "pure":
            return 1 / pure_epsilon_of_mu(mu_b / math.sqrt(n))
        if kind == "pure+gauss":
            left = mu_b**2 - pure_mu(self.eps / 2) ** 2
            return 1 / math.sqrt(left) if left > 0 else REFUSED
        half = n // 2
        return 1 / largest(lambda mu: half * (mu**2 + pure_mu(mu) ** 2) <= mu_b**2, 1e-6, 50.0)

    def _zcdp(self, kind: str, n: int, rho_b: float) -> float:
        if kind == "pure":
            return 1 / math.sqrt(2 * rho_b / n)
        if kind == "pure+gauss":
            left = rho_b - (self.eps / 2) ** 2 / 2
            return 1 / math.sqrt(2 * left) if left > 0 else REFUSED
        # gauss: n mu^2/2; mixed: n/2 (mu^2/2 + mu^2/2) -- the same total
        return math.sqrt(n / (2 * rho_b))

    def _basic(self, kind: str, n: int, delta: float) -> float:
        if kind == "pure":
            return n / self.eps
        if kind == "gauss":
            return analytic_gaussian_sigma(1.0, self.eps / n, delta / n)
        if kind == "pure+gauss":
            return analytic_gaussian_sigma(1.0, self.eps / 2, delta)
        half = n // 2

        def fits(mu: float) -> bool:
            return half * (mu + basic_gauss_epsilon(mu, delta / half)) <= self.eps

        return 1 / largest(fits, 1e-5, 50.0)

    # -- the bar
    def pld(self, kind: str, n: int) -> float:
        eps, dlt = self.eps, self.dlt
        if kind == "gauss":

            def fits(mu: float) -> bool:
                return bool(gauss_pld(mu, n).get_delta_for_epsilon(eps) <= dlt)

            return 1 / largest(fits, 1e-4, 50.0)
        if kind == "pure":
            return 1 / largest(
                lambda e: pure_pld(e, n).get_delta_for_epsilon(eps) <= dlt, 1e-5, 50.0
            )
        if kind == "pure+gauss":
            first = pure_pld(eps / 2, 1)
            return 1 / largest(
                lambda mu: first.compose(gauss_pld(mu, 1)).get_delta_for_epsilon(eps) <= dlt,
                1e-4,
                50.0,
            )
        half = n // 2
        return 1 / largest(
            lambda mu: bool(
                gauss_pld(mu, half).compose(pure_pld(mu, half)).get_delta_for_epsilon(eps) <= dlt
            ),
            1e-4,
            50.0,
        )

    def rule(self, rule: Rule, kind: str, n: int) -> float:
        return min(self.figure(kind, n, f) for f in rule.filters)


GRID_EPSILONS = ("0.1", "0.5", "1", "2", "8")
GRID_DELTAS = ("1e-8", "1e-6", "1e-5", "1e-3")


def grid() -> tuple[str, float, float]:
    """The shipped default on Gaussian releases over the grid: sigma at N = 1 over ``basic``'s,
    at N = 10 and 100 over the PLD accountant's (and ``zcdp``'s for comparison); the table and
    the worst ratios (N = 1 over basic, N = 10/100 over PLD)."""
    rows = [
        "| budget | hybrid / basic, N=1 (bar 1.01) | hybrid / PLD, N=10 | hybrid / PLD, N=100 "
        "(bar 1.05) | zcdp / basic, N=1 | zcdp / PLD, N=100 |",
        "|---|---|---|---|---|---|",
    ]
    worst_one = worst_many = 0.0
    for eps_text in GRID_EPSILONS:
        for delta_text in GRID_DELTAS:
            budget = Budget(Decimal(eps_text), Decimal(delta_text))
            basic = budget.rule(RULES[0], "gauss", 1)
            one = budget.rule(SHIPPED, "gauss", 1) / basic
            ten = budget.rule(SHIPPED, "gauss", 10) / budget.pld("gauss", 10)
            pld_100 = budget.pld("gauss", 100)
            hundred = budget.rule(SHIPPED, "gauss", 100) / pld_100
            zcdp_one = budget.rule(ZCDP, "gauss", 1) / basic
            zcdp_100 = budget.rule(ZCDP, "gauss", 100) / pld_100
            worst_one, worst_many = max(worst_one, one), max(worst_many, ten, hundred)
            rows.append(
                f"| ({eps_text}, {delta_text}) | {one:.4f} | {ten:.4f} | {hundred:.4f} | "
                f"{zcdp_one:.3f} | {zcdp_100:.3f} |"
            )
            print(rows[-1], file=sys.stderr)
    return "\n".join(rows), worst_one, worst_many


def cell(value: float, basic: float) -> str:
    if value == REFUSED:
        return "refused"
    return f"{value:.4g} ({value / basic:.3f})"


def tables(quick: bool) -> tuple[str, str]:
    """The per-sequence table (each rule's noise and its ratio to basic's) and the summary."""
    budgets = BUDGETS[:1] if quick else BUDGETS
    sequences = [s for s in SEQUENCES if not quick or s[1] <= 10]
    head = "| budget | sequence | N | pld (/basic) | " + " | ".join(
        f"{r.name} (/basic)" for r in RULES
    )
    detail = [head + " |", "|---|---|---|" + "---|" * (len(RULES) + 1)]
    worst: dict[str, float] = {r.name: 0.0 for r in RULES}
    gauss_pld_ratio: dict[tuple[str, int], float] = {}
    for epsilon, delta in budgets:
        budget = Budget(epsilon, delta)
        for kind, n in sequences:
            basic = budget.rule(RULES[0], kind, n)
            pld_value = budget.pld(kind, n)
            cells = [f"({epsilon}, {delta})", kind, str(n), cell(pld_value, basic)]
            for rule in RULES:
                value = budget.rule(rule, kind, n)
                cells.append(cell(value, basic))
                worst[rule.name] = max(worst[rule.name], value / basic)
                if kind == "gauss" and n in (10, 100):
                    key = (rule.name, n)
                    gauss_pld_ratio[key] = max(gauss_pld_ratio.get(key, 0.0), value / pld_value)
            detail.append("| " + " | ".join(cells) + " |")
            print(detail[-1], file=sys.stderr)
    summary = [
        "| rule | worst noise / basic's, any sequence (bar 1.01) | Gaussian N=10 / PLD | "
        "Gaussian N=100 / PLD (bar 1.05) | meets both |",
        "|---|---|---|---|---|",
    ]
    for rule in RULES:
        w = worst[rule.name]
        g10 = gauss_pld_ratio.get((rule.name, 10), math.nan)
        g100 = gauss_pld_ratio.get((rule.name, 100), math.nan)
        ok = w <= 1.01 and g10 <= 1.05 and (quick or g100 <= 1.05)
        shown = "refuses some" if w == REFUSED else f"{w:.3f}"
        summary.append(
            f"| {rule.name} | {shown} | {g10:.3f} | {g100:.3f} | {'yes' if ok else 'no'} |"
        )
    return "\n".join(detail), "\n".join(summary)


def section(detail: str, summary: str, grid_rows: str, worst_one: float, worst_many: float) -> str:
    shares = (
        f"A' {SHARES.gaussian}, B {SHARES.conversion} (conversion) + {SHARES.mechanisms} "
        f"(approximate steps), C {SHARES.basic}"
    )
    return "\n".join(
        [
            START,
            "## Which accounting can be the default (`bench/bench_accounting_default.py`)",
            "",
            "Issue 31, item 5 asks for a default within 1% of `basic`'s noise for every sequence "
            "and within 5% of the PLD accountant's for Gaussian releases at N = 10 and 100. "
            "Every rule below is sound (a union of filters, each with a fully adaptive theorem: "
            "A = GDP on Gaussian steps, A' = GDP also admitting pure eps steps as "
            "mu = -2 Phi^-1(1/(1+e^eps)), B = approximate zCDP, C = basic; the figures are "
            "their shares of delta). Worst over the budgets and sequences measured, worst "
            "over budgets for the PLD ratios:",
            "",
            summary,
            "",
            "No sound rule meets the issue's first bar for *every* sequence, and none can by "
            "splitting delta: the sequence 'a pure release of eps/2, then a Gaussian one' is "
            "within 1% of `basic` only under a filter that charges the pure step eps/2 and "
            "holds nearly all of delta (C with 0.9 delta: +0.6% at (1, 1e-6), +1.6% at (0.5, "
            "1e-3)); A' charges eps/2 = 0.5 as mu = 0.62 > mu_B = 0.24, B as rho = 0.125 > "
            "rho_B = 0.023 (at (1, 1e-6)), and the share of delta left for the GDP filter then "
            "costs Gaussian-only sequences 7.5% to 28% over PLD.",
            "",
            f"**The shipped default, `hybrid`** ({shares}; `service/accounting.py`, "
            "`DEFAULT_HYBRID_SHARES`) meets the bars for Gaussian releases: over eps in {0.1, "
            "0.5, 1, 2, 8} x delta in {1e-8, 1e-6, 1e-5, 1e-3}, one Gaussian release's sigma is "
            f"at most {worst_one:.4f}x `basic`'s and 10 or 100 releases' at most "
            f"{worst_many:.4f}x the PLD accountant's (dp-accounting, discretisation 1e-4). "
            "Why these shares: the 1% bar at N = 1 binds at (0.1, 1e-3), where A' on 95% of "
            "delta would give 1.0097x (too close once calibration rounds) and 96% gives 1.0077x; "
            "a GDP filter is exact for Gaussian releases, so N = 10 and 100 sit at the same "
            "ratio to PLD. The other 4%: B's approximate steps 2% (the aggregators' PTR tests "
            "and exact_gapmax spend delta only there or in C), B's conversion 1% (its rho "
            "budget shrinks only with log(1/delta)), C 1% (a mechanism with no proven profile "
            "still runs at a small delta). Pure steps need none of it: A' charges them "
            "`pure_mu(eps)^2`. `zcdp` stays selectable (mixed plans with many approximate steps "
            "measure better there), as do `gaussian` and `basic`.",
            "",
            grid_rows,
            "",
            "Noise per release (sensitivity 1) and its ratio to `basic`'s at the same budget "
            "(refused: no noise makes the whole sequence fit):",
            "",
            detail,
            "",
            END,
        ]
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="one budget, N <= 10; no files")
    args = parser.parse_args()
    detail, summary = tables(args.quick)
    print(summary)
    print()
    print(detail)
    if not args.quick:
        grid_rows, worst_one, worst_many = grid()
        print(grid_rows)
        publish_section(
            RESULT, START, END, section(detail, summary, grid_rows, worst_one, worst_many)
        )


if __name__ == "__main__":
    main()
