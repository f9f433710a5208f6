"""Which accounting fits the mechanisms an owner plans to use (issue 31, item 5).

The default is ``hybrid`` (either of three filters, :class:`service.accounting.HybridState`):
it admits every mechanism, and Gaussian releases get within 0.8% of ``basic``'s noise at one
release and of the PLD accountant's at 10 and 100 (``bench/bench_accounting_default.py``,
docs/benchmarks.md "Which accounting can be the default"). It is the general recommendation
(an upload that names no plan); a plan that names its mechanisms gets the accounting measured
better for it, by the table at ``(1, 1e-6)``:

* a mechanism with no proven privacy profile (only ``basic`` admits it) -> ``basic``;
* only purely Gaussian mechanisms -> ``gaussian``: the GDP filter's noise equals the PLD
  accountant's at N = 1, 10, 100 (``hybrid`` pays up to 0.8% more for the 4% of delta it keeps
  for its other filters, ``zcdp`` 10.5% more, ``basic`` 3.1x at N = 10);
* pure or approximate steps (aggregators, propose-test-release, ``auto``): ``zcdp`` from three
  releases on (0.58x ``basic``'s noise at 10 mixed releases; ``hybrid`` keeps only 3% of delta
  for its zCDP filter, so after one approximate step its Gaussian releases pay more than under
  ``zcdp``), ``basic`` for one or two (``zcdp`` pays 1.28x for a Gaussian and a pure release,
  and charges a lone pure step ``eps^2/2``).

``auto`` counts as non-Gaussian in a plan: under ``gaussian`` it can only become
``analyze_gauss``. A dry run judges one ``auto`` request by the steps it declares
(:func:`service.preview.recommendation`): all Gaussian gets ``hybrid``, never ``gaussian``.
Public facts only (mechanism names, the request's share of the budget): no data.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from decimal import Context, Decimal
from typing import Literal

from api_schemas.common import format_budget
from service.accounting import Accounting
from service.mechanisms.registry import MECHANISMS

#: Up to this many releases, ``basic`` gives less noise than ``zcdp`` when any step is pure
#: or approximate (measured: 2 mixed releases 1.28x, 10 mixed releases 0.58x ``basic``'s).
FEW_RELEASES = 2

SEE = "docs/benchmarks.md, 'Which accounting can be the default'"


@dataclass(frozen=True)
class Advice:
    """The accounting that fits a plan, and why (one sentence for a person)."""

    accounting: Accounting
    reason: str


Kind = Literal["unprofiled", "gaussian", "mixed"]


def kind_of(mechanism: str) -> Kind:
    """What a registered mechanism's declared accountings say about its steps: ``unprofiled``
    (only ``basic`` admits it), ``gaussian`` (every step Gaussian; ``auto`` excepted, which
    under ``gaussian`` can only become ``analyze_gauss``) or ``mixed``."""
    admitted = MECHANISMS[mechanism].accountings
    if "zcdp" not in admitted:
        return "unprofiled"
    return "gaussian" if "gaussian" in admitted and mechanism != "auto" else "mixed"


def advise(names: list[str], kind: Kind, releases: int | None = None) -> Advice:
    """The accounting for releases of ``names`` whose steps are of ``kind``, ``releases`` of
    them if known (the rule in the module's docstring)."""
    shown = ", ".join(names)
    verb = "is" if len(names) == 1 else "are"
    if kind == "unprofiled":
        return Advice(
            "basic",
            f"only basic admits {shown} (no proven privacy profile for the other filters).",
        )
    if kind == "gaussian":
        return Advice(
            "gaussian",
            f"{shown} {verb} purely Gaussian: the Gaussian-DP filter gives the PLD "
            "accountant's noise at every number of releases (hybrid, the default, up to 0.8% "
            "more and admits every mechanism; zcdp about 8-23% more, basic 3.1x more at ten "
            "releases). See " + SEE + ".",
        )
    if releases is not None and releases <= FEW_RELEASES:
        return Advice(
            "basic",
            f"{shown} take{'s' if len(names) == 1 else ''} pure or approximate steps and at "
            f"most {FEW_RELEASES} releases of this epsilon fit the budget: basic gives the "
            "least noise (zcdp about 1.28x more for a Gaussian and a pure release). See "
            + SEE
            + ".",
        )
    return Advice(
        "zcdp",
        f"{shown} take{'s' if len(names) == 1 else ''} pure or approximate steps: zcdp admits "
        "them and from three releases on gives the least noise of the sound filters (0.58x "
        "basic's at ten mixed releases); for one or two releases basic gives less. See "
        + SEE
        + ".",
    )


def for_one_request(names: list[str], kind: Kind, releases: int | None = None) -> Advice:
    """The advice a dry run gives from one request (:func:`advise`), except that one purely
    Gaussian request is no plan of purely Gaussian releases: ``gaussian`` would refuse every
    other mechanism on the dataset for at most 0.8% less noise, so the advice stays ``hybrid``
    (the default) and says when ``gaussian`` is worth it (a plan named at upload)."""
    if kind != "gaussian":
        return advise(names, kind, releases)
    shown = ", ".join(names)
    return Advice(
        "hybrid",
        f"{shown} {'is' if len(names) == 1 else 'are'} purely Gaussian, and hybrid (the default) "
        "gives it within 0.8% of the PLD accountant's noise while admitting every mechanism; "
        "gaussian gives the PLD accountant's noise but refuses every non-Gaussian mechanism: "
        "choose it only when purely Gaussian releases are all that is planned (name them in "
        "planned_mechanisms at upload). See " + SEE + ".",
    )


def recommend(mechanisms: Iterable[str]) -> Advice:
    """The accounting for an owner's plan: releases of ``mechanisms`` (registered names; none:
    every mechanism), how many not yet known."""
    names = sorted(set(mechanisms))
    if not names:
        return Advice(
            "hybrid",
            "hybrid (the default) admits every mechanism and gives Gaussian releases within "
            "0.8% of basic's noise at one release and of the PLD accountant's at 10 and 100; "
            "name the mechanisms you plan to use (planned_mechanisms) for a tighter choice: "
            "gaussian when all are purely Gaussian, zcdp for many releases with approximate "
            "steps, basic for one or two. See " + SEE + ".",
        )
    kinds = {name: kind_of(name) for name in names}
    unprofiled = [name for name in names if kinds[name] == "unprofiled"]
    if unprofiled:
        return advise(unprofiled, "unprofiled")
    if all(kind == "gaussian" for kind in kinds.values()):
        return advise(names, "gaussian")
    return advise(names, "mixed")


_QUOTIENT_CONTEXT = Context(prec=100)


def releases_of(epsilon_total: Decimal, epsilon: Decimal) -> int | None:
    """How many releases of ``epsilon`` the stated ``epsilon_total`` holds (the plan a request
    implies); ``None`` when ``epsilon`` is 0."""
    if epsilon <= 0:
        return None
    # Both have at most 30 places and budgets are at most 1e6 or so: the quotient can have 37
    # digits, past the default context's 28 (whose // then raises DivisionImpossible).
    return int(_QUOTIENT_CONTEXT.divide_int(epsilon_total, epsilon))


def parse_planned(raw: str | None) -> list[str]:
    """``planned_mechanisms`` (comma-separated registered names) as a list; ``ValueError``
    names the first unknown one."""
    if raw is None:
        return []
    names = [part.strip() for part in raw.split(",") if part.strip()]
    for name in names:
        if name not in MECHANISMS:
            raise ValueError(f"unknown mechanism {name!r}; one of: {', '.join(sorted(MECHANISMS))}")
    return names


def hybrid_holds_no_delta(
    accounting: str,
    mu_total: Decimal | None,
    rho_total: Decimal | None,
    delta_basic: Decimal | None,
) -> bool:
    """Whether a ``hybrid`` budget can never admit a release that spends delta (or is
    Gaussian): each filter's share of ``delta_total`` rounds to 0 at the ledger's 30 places
    (no ``mu_total`` for A', no ``rho_total`` for B, no delta for C), e.g. ``delta_budget``
    1e-30. Only pure releases run there."""
    return accounting == "hybrid" and not (mu_total or rho_total or delta_basic)


def too_small_for_hybrid(delta_budget: Decimal) -> Advice:
    """The advice for an upload whose hybrid budget holds no delta
    (:func:`hybrid_holds_no_delta`): the general one says hybrid "admits every mechanism",
    which is false there."""
    return Advice(
        "basic",
        f"delta_budget {format_budget(delta_budget)} is too small for hybrid: each of its "
        "filters' shares of delta (96%, 3% and 1%) rounds to 0 at the ledger's 30 decimal "
        "places, so no Gaussian or approximate release can run on this dataset (only "
        "smooth_sensitivity and auto at delta = 0); basic charges delta as given: upload "
        "again with accounting basic, or with a larger delta_budget.",
    )
