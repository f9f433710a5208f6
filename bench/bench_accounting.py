"""Accounting across releases (issue 23): the noise each of N equal releases gets on a dataset of
``(epsilon, delta)`` under each accounting, through the service's own calibration path.

    PYTHONPATH=. .venv/bin/python bench/bench_accounting.py [--quick]

For each N in 1, 2, 10, 100, 1000 and each budget:

* Gaussian-only: N equal ``analyze_gauss`` releases (k = 5, d = 50, C = 1). ``basic`` gives each
  ``(eps/N, delta/N)`` (analytic Gaussian); ``gaussian`` each ``mu = mu_B/sqrt(N)``; ``zcdp``
  each ``rho = rho_B/N`` (the default split: half of delta for the conversion). The figure is
  each release's ``sigma`` (from the dry run's path: ``releases._prepare``, which the real
  request and the worker share) and basic's ``sigma`` over it.
* Mixed: N/2 ``analyze_gauss`` and N/2 ``friendly_aggregate`` (n = 200,000, t = 1,000, radius
  given) on ``zcdp`` against ``basic``: the Gaussian releases' ``sigma`` and friendly's mean
  noise per unit sensitivity (``1/mean mu``), ratios to basic. ``gaussian`` accounting refuses
  ``friendly_aggregate`` (not purely Gaussian), so it has no mixed row.

Writes ``bench/results/accounting.md`` and its section of docs/benchmarks.md (``python -m bench
--report`` keeps it). No timing: every figure is a deterministic function of public facts.
"""

from __future__ import annotations

import argparse
import sys
import uuid
from decimal import Decimal
from pathlib import Path

from api_schemas.releases import ReleaseRequest
from bench.report import publish_section
from service import accounting, releases
from service.db.models import Dataset
from service.errors import InvalidInput
from service.mechanisms.friendly_aggregate import GdpSplit, release_split, split_mean_sigma

ROOT = Path(__file__).resolve().parent.parent
RESULT = ROOT / "bench" / "results" / "accounting.md"
START, END = "<!-- accounting:start -->", "<!-- accounting:end -->"

NS = (1, 2, 10, 100, 1000)
BUDGETS = ((Decimal(1), Decimal("1e-6")), (Decimal(8), Decimal("1e-6")))
D, K, N_ROWS, N_FRIENDLY = 50, 5, 10_000, 200_000


def dataset(kind: str, epsilon: Decimal, delta: Decimal, n_rows: int) -> Dataset:
    """A dataset row as the upload would register it (not stored)."""
    row = Dataset(
        id=uuid.uuid4(), name="bench", n_rows=n_rows, n_cols=D, row_norm_bound=1.0,
        epsilon_total=epsilon, delta_total=delta, accounting=kind, n_batches=1,
    )  # fmt: skip
    if kind == "gaussian":
        row.mu_total = accounting.mu_budget(epsilon, delta)
        row.rho_total = accounting.budget_rho_of_mu(row.mu_total)
    elif kind == "zcdp":
        row.delta_conversion = delta * accounting.DEFAULT_CONVERSION_SHARE
        row.rho_total = accounting.rho_budget(epsilon, row.delta_conversion)
    return row


def prepared(row: Dataset, mechanism: str, k: int, params: dict[str, object], **cost: Decimal):
    body = ReleaseRequest(mechanism=mechanism, k=k, params=params, **cost)
    return releases._prepare(body, row)


def gauss_sigma(row: Dataset, n: int) -> float:
    """The sigma of one of ``n`` equal analyze_gauss releases on ``row``."""
    eps, delta = row.epsilon_total, row.delta_total
    if row.accounting == "basic":
        cost = {"epsilon": eps / n, "delta": delta / n}
    elif row.accounting == "gaussian":
        assert row.mu_total is not None
        cost = {"mu": accounting.round_down(row.mu_total / Decimal(n).sqrt())}
    else:
        assert row.rho_total is not None
        cost = {"rho": accounting.round_down(row.rho_total / n)}
    shown = prepared(row, "analyze_gauss", K, {"clip_norm": 1.0}, **cost)
    # The Gram step's noise (analyze_gauss also draws the explained-variance sums, with their
    # own share of the same mu: the ratio between accountings is the same for every step).
    return float(shown.mechanism.preview(shown.context, shown.spec).scales["sigma"])


def friendly_noise(row: Dataset, n: int) -> float:
    """Friendly's mean noise per unit sensitivity when ``n`` releases alternate analyze_gauss
    and friendly_aggregate: each friendly release gets ``1/n`` of the budget (basic: epsilon and
    delta; zcdp: rho, and ``2/n`` of the mechanisms' delta, since only friendly spends it)."""
    params = {"t": 1000, "radius": 0.5}
    eps, delta = row.epsilon_total, row.delta_total
    if row.accounting == "basic":
        cost = {"epsilon": eps / n, "delta": delta / n}
    else:
        assert row.rho_total is not None and row.delta_conversion is not None
        spare = delta - row.delta_conversion
        cost = {
            "rho": accounting.round_down(row.rho_total / n),
            "delta": accounting.round_down(spare / max(1, n // 2)),
        }
    shown = prepared(row, "friendly_aggregate", 1, params, **cost)
    split = release_split(shown.spec.epsilon, shown.spec.delta, True, t=1000)
    return 1.0 / split.mean_mu if isinstance(split, GdpSplit) else split_mean_sigma(1.0, split)


def friendly_or_refusal(row: Dataset, n: int) -> float | str:
    """:func:`friendly_noise`, or the service's 422 in words (t = 1,000 subsets are too few
    for the budget each release gets)."""
    try:
        return friendly_noise(row, n)
    except InvalidInput:
        return "refused (422: t too small for the budget)"


def table(quick: bool) -> str:
    ns = NS[:3] if quick else NS
    lines = [
        "| budget | N | basic sigma | gaussian sigma (x) | zcdp sigma (x) | mixed: gauss sigma "
        "zcdp (x) | mixed: friendly noise basic | zcdp (x) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for epsilon, delta in BUDGETS[:1] if quick else BUDGETS:
        # hybrid has its own comparison (bench_accounting_default); this table is the filters.
        kinds = ("basic", "gaussian", "zcdp")
        rows = {kind: dataset(kind, epsilon, delta, N_ROWS) for kind in kinds}
        big = {kind: dataset(kind, epsilon, delta, N_FRIENDLY) for kind in ("basic", "zcdp")}
        for n in ns:
            sigma = {kind: gauss_sigma(row, n) for kind, row in rows.items()}
            cells = [f"({epsilon}, {delta})", str(n), f"{sigma['basic']:.4g}"]
            cells += [
                f"{sigma[kind]:.4g} ({sigma['basic'] / sigma[kind]:.2f}x)"
                for kind in ("gaussian", "zcdp")
            ]
            if n >= 2:
                # Mixed: the Gaussian half gets rho_B/n each (basic: eps/n) as above.
                cells.append(f"{sigma['zcdp']:.4g} ({sigma['basic'] / sigma['zcdp']:.2f}x)")
                noise = {kind: friendly_or_refusal(big[kind], n) for kind in ("basic", "zcdp")}
                basic_f, zcdp_f = noise["basic"], noise["zcdp"]
                cells.append(basic_f if isinstance(basic_f, str) else f"{basic_f:.4g}")
                if isinstance(zcdp_f, str):
                    cells.append(zcdp_f)
                elif isinstance(basic_f, str):
                    cells.append(f"{zcdp_f:.4g}")
                else:
                    cells.append(f"{zcdp_f:.4g} ({basic_f / zcdp_f:.2f}x)")
            else:
                cells += ["", "", ""]
            lines.append("| " + " | ".join(cells) + " |")
            print(lines[-1], file=sys.stderr)
    return "\n".join(lines)


def section(body: str) -> str:
    return "\n".join(
        [
            START,
            "## Accounting across releases (`bench/bench_accounting.py`)",
            "",
            "Each of N equal releases on one dataset, through the service's calibration path "
            "(`releases._prepare`, shared by requests, dry runs and the worker): `basic` gives "
            "each (eps/N, delta/N); `gaussian` each mu_B/sqrt(N) (Gaussian-DP filter); `zcdp` "
            "each rho_B/N (approximate-zCDP filter, half of delta for the CKS conversion). "
            "analyze_gauss with k = 5, d = 50, C = 1; (x) is basic's sigma over the "
            "accounting's. Mixed: N/2 analyze_gauss and N/2 friendly_aggregate (n = 200,000, "
            "t = 1,000, radius given) under zcdp; friendly's figure is its mean's noise per unit "
            "sensitivity (gaussian accounting refuses friendly_aggregate: not purely Gaussian).",
            "",
            body,
            "",
            END,
        ]
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="N <= 10, one budget; no files")
    args = parser.parse_args()
    body = table(args.quick)
    print(body)
    if not args.quick:
        publish_section(RESULT, START, END, section(body))


if __name__ == "__main__":
    main()
