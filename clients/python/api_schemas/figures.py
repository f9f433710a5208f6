"""Budget figures for people: significant digits, rounded the safe way.

Tables (the ``dpss`` CLI, the slim client's ``dpss-remote``) print budgets to
:data:`SIGNIFICANT` significant digits; the API and ``--json`` keep the exact values. A spent
figure or a cost is rounded **up** and a total or remaining figure **down**, so a shown figure
never overstates what is left.
"""

from __future__ import annotations

from decimal import ROUND_CEILING, ROUND_FLOOR, Decimal, InvalidOperation

__all__ = ["SIGNIFICANT", "shown"]

#: Significant digits of a budget figure in a table.
SIGNIFICANT = 4


def shown(value: Decimal | str | None, *, up: bool = False, digits: int = SIGNIFICANT) -> str:
    """``value`` to ``digits`` significant digits in plain notation, rounded up (``up``: a
    spent figure, a cost) or down (a total, a remaining figure); ``-`` for ``None``."""
    if value is None:
        return "-"
    try:
        number = value if isinstance(value, Decimal) else Decimal(value)
    except InvalidOperation:
        return str(value)
    if not number.is_finite():
        return str(number)
    if number == 0:
        return "0"
    quantum = Decimal(1).scaleb(number.adjusted() - digits + 1)
    rounded = number.quantize(quantum, rounding=ROUND_CEILING if up else ROUND_FLOOR)
    # Plain notation always, as the JSON writes budgets ("0.0000001", never "1E-7").
    return format(rounded.normalize(), "f")


#: Where rho and mu are explained: this text, the section "Reading a budget" of
#: docs/mechanisms.md (tests/test_spend_figures.py checks they are the same) and the dashboard's
#: page ``/dashboard/reading-a-budget``, which every dashboard screen and CLI table links to.
READING_A_BUDGET: tuple[tuple[str, str], ...] = (
    (
        "Epsilon and delta, everywhere",
        "Every budget, grant, refusal (409), dry run, ledger entry, chart and metric states "
        "spend and what remains as (epsilon, delta) at the dataset's delta_total, the delta its "
        "owner set at upload (a grant given in epsilon at its own delta, see Grants). "
        "epsilon_spent is an epsilon at which everything spent so far is (epsilon, "
        "delta_total)-DP, rounded up, read at the delta the budget holds for it (zcdp: "
        "delta_conversion). epsilon_remaining is what the ledger admits: a request for exactly "
        "it is admitted, one above it refused, and a budget spent to the end states nothing "
        "left; under basic it is epsilon_total - epsilon_spent rounded down, under gaussian "
        "and zcdp what a Gaussian release at delta_total is admitted at (as under hybrid; "
        "under zcdp below epsilon_total even unspent, 0.897 of a (1, 1e-6) budget: its "
        "rho_total is epsilon_total converted by a bound looser than the Gaussian's own curve, "
        "at half the delta). "
        "Under hybrid (the default) its Gaussian-DP filter holds 96% of delta, so a hybrid "
        "budget's epsilon_total is what it admits for a Gaussian release at delta_total, at "
        "most the epsilon set (0.9979 of a (1, 1e-6) budget), and epsilon_remaining is the "
        "largest epsilon the next Gaussian release asked at (epsilon, delta_total) is admitted "
        "at now. That is more than epsilon_total - epsilon_spent once something is spent: the "
        "filter adds up mu^2, not epsilon (after two Gaussian releases of 0.3 at 1e-7 on a "
        "(1, 1e-5) budget, spent 0.33 and remaining 0.92, not 0.67); epsilon_spent still states "
        "what was spent, the guarantee. epsilon_remaining_pure is what a pure release (delta "
        "0) is admitted at: under hybrid up to the owner's whole epsilon while its basic filter "
        "holds (1 of a fresh (1, 1e-6) budget, above its epsilon_total 0.9979), far less once "
        "that filter is closed (0.199 in the example, where a pure release of 0.3 is refused: "
        "a pure step costs the Gaussian-DP filter more than a Gaussian one); basic: "
        "epsilon_remaining; zcdp: sqrt(2 rho_remaining); null under gaussian. A 409 states the "
        "same remaining figures as the budget, with stated_at_delta, the delta "
        "epsilon_remaining holds at. Approximate releases are charged differently again. A "
        "refused request and a "
        "dry run that is not affordable give epsilon_admissible: the largest epsilon (3 "
        "digits, rounded down, checked) at which the same request is admitted now; when none "
        "is at its delta, delta_admissible and delta_admissible_epsilon: another delta (0 for "
        "a mechanism that allows pure DP, else a smaller one) and the largest epsilon the same "
        "request is admitted at with it; the 409's message says at which delta each figure "
        "holds (epsilon_admissible at the request's own).",
    ),
    (
        "rho and mu, beside epsilon",
        "Under the gaussian and zcdp accountings the ledger charges a native figure, shown "
        "beside epsilon and never instead of it. zcdp charges rho: a release is rho-zCDP, and "
        "rhos add up (a pure epsilon-DP step costs epsilon^2/2). gaussian charges mu^2/2: a "
        "release is mu-GDP, and mu^2 adds up (so rho = mu^2/2 there too). Because rho and mu^2 "
        "add up while epsilon does not, ten equal releases cost ten times the rho but far less "
        "than ten times the epsilon: the first release of a budget looks dear in epsilon, the "
        "later ones cheap. hybrid (the default) shows both: mu for its Gaussian-DP filter (a "
        "pure epsilon-DP step costs mu = -2 Phi^-1(1/(1+e^epsilon))) and rho for its zCDP "
        "filter; its epsilon_spent is the smallest of its filters' that still hold.",
    ),
    (
        "The delta held for the conversion",
        "Turning rho (or mu) into (epsilon, delta) needs some delta. zcdp holds "
        "delta_conversion (by default half of delta_total) for it; gaussian holds all of "
        "delta_total; hybrid holds 97% (96% for its Gaussian-DP filter, 1% for its zCDP "
        "filter's conversion). That delta is shown as delta_reserved_for_conversion: no "
        "mechanism spends it, so delta_remaining is what mechanisms may still spend. Under "
        "hybrid the other 3% are its zCDP filter's share for approximate steps (2%) and its "
        "basic filter's share for single releases (1%): delta_spent and delta_remaining are "
        "those two shares, spent (or closed with their filter) and still available, so "
        "delta_reserved_for_conversion + delta_spent + delta_remaining = delta_total; each "
        "filter counts every release, so one release may move both shares.",
    ),
    (
        "Grants",
        "A grant may be given in epsilon (with delta, by default the dataset's delta_total) on "
        "every accounting: it is converted to the grant's rho or mu, rounded down, so what the "
        "grant's releases spend is (epsilon, delta)-DP, and its epsilon_total, epsilon_spent "
        "and epsilon_remaining are all at that delta. Given in rho or mu, its epsilon is that "
        "rho or mu converted at the dataset's delta_total. Under hybrid a grant is given in "
        "epsilon (and delta): a hybrid budget of its own with the dataset's shares, enforced "
        "and stated in its own terms: its epsilon_total, epsilon_spent and epsilon_remaining "
        "are all at the grant's delta (a (1, 1e-6) grant after one (0.5, 1e-6) Gaussian "
        "release: total 0.9979, spent 0.5, remaining 0.8386, what a Gaussian release at 1e-6 "
        "is still admitted at).",
    ),
    (
        "Figures for people",
        f"Tables (the CLI's and the dashboard's) print {SIGNIFICANT} significant digits, spent "
        "rounded up and remaining rounded down, so a printed figure never overstates what is "
        "left; the API and --json keep the exact "
        "values (30 decimal places). The ledger states each charge as epsilon_after (the "
        "dataset's epsilon_spent just after it) and epsilon_increment (what it added).",
    ),
)
