"""Public-facts warnings for mechanisms the measured rule table says are dominated (issue 16).

Issue 16's done-when: "no mechanism is offered as a choice where it is worse than a random
subspace while another runs". Two mechanisms are kept (they reproduce their papers) but are
never the better choice where a Gaussian alternative runs at the same cost:

* ``smooth_sensitivity`` with ``delta > 0`` (its Gaussian variant): at least 9x less accurate
  than ``analyze_gauss`` even with a huge eigengap, and no better than a random subspace at
  ``d >= 50`` on the benchmark grid; its Cauchy variant (the default on a ``zcdp`` dataset) is
  worse still and spends the delta only on a private centre: the warning names the variant
  that runs (docs/mechanisms.md, section smooth_sensitivity and "Choosing a mechanism").
  With ``delta = 0`` it is the only pure mechanism: no warning.
* ``gap_perturbation``: never more accurate than ``analyze_gauss`` (at least 2.8x, about 3x,
  worse wherever both run; docs/mechanisms.md, section gap_perturbation).

``friendly_aggregate``, ``histogram_aggregate`` and ``exact_gapmax`` depend on the data's
structure (they win by orders of magnitude near a subspace): no warning. The rule reads the
mechanism's name, ``delta`` and ``d`` only, never the rows; ``analyze_gauss`` accepts every
request these two accept (same row-bound and centring params), so the alternative always runs.
"""

from __future__ import annotations

from dataclasses import dataclass

#: The documentation these warnings cite.
DOCS = "docs/mechanisms.md"


@dataclass(frozen=True)
class DominanceWarning:
    """One warning of a dry run (see :class:`api_schemas.releases.PreviewWarning`)."""

    code: str
    message: str
    better_mechanism: str
    docs: str


def dominance_warnings(
    mechanism: str, delta: float, n_cols: int, noise: str | None = None
) -> list[DominanceWarning]:
    """The warnings for a request of ``mechanism`` at ``delta`` on ``n_cols`` columns (public
    facts only); empty when the mechanism is not dominated there. ``noise`` is
    smooth_sensitivity's variant as the release will run it (after the accounting's default:
    ``cauchy`` on a hybrid or zcdp dataset); ``None`` means its own default (Gaussian iff
    ``delta > 0``), so the warning names the variant that actually runs."""
    if mechanism == "smooth_sensitivity" and delta > 0:
        random_level = (
            f" and no better than a random subspace at d >= 50 (here d = {n_cols})"
            if n_cols >= 50
            else " (and no better than a random subspace at d >= 50)"
        )
        if (noise or "gaussian") == "cauchy":
            # The Cauchy variant spends delta only on a private centre; its basis noise has the
            # same d k problem as the Gaussian one, worse (beta = eps/(6 d k), S1 = sqrt(d k) S;
            # docs/mechanisms.md, smooth_sensitivity), and heavy tails.
            message = (
                "smooth_sensitivity runs its pure Cauchy variant here (the default under the "
                "hybrid accounting, the service's default, and under zcdp, or requested with "
                "noise: cauchy): its basis spends no delta (only a "
                "private centre does) and its noise has heavy tails and the same d k problem "
                "as the Gaussian variant, worse; the Gaussian variant was itself at least 9x "
                "less accurate than analyze_gauss at the same (epsilon, delta) on every "
                f"measured dataset, even with a huge eigengap,{random_level}; analyze_gauss "
                "takes the same params and always runs. Use smooth_sensitivity only with "
                "delta = 0 (the only pure-DP mechanism)."
            )
        else:
            message = (
                "smooth_sensitivity with delta > 0 (its Gaussian variant) was at least 9x "
                "less accurate than analyze_gauss at the same (epsilon, delta) on every "
                f"measured dataset, even with a huge eigengap,{random_level}; "
                "analyze_gauss takes the same params and always runs. Use "
                "smooth_sensitivity only with delta = 0 (the only pure-DP mechanism)."
            )
        return [
            DominanceWarning(
                code="dominated_mechanism",
                message=message,
                better_mechanism="analyze_gauss",
                docs=f"{DOCS}#smooth_sensitivity (and #choosing-a-mechanism)",
            )
        ]
    if mechanism == "gap_perturbation":
        return [
            DominanceWarning(
                code="dominated_mechanism",
                message=(
                    "gap_perturbation is never more accurate than analyze_gauss at the same "
                    "(epsilon, delta): about 3x worse (at least 2.8x) wherever both run, and it "
                    "ends in a charged no_result below an eigengap of about "
                    "C^2 (1 + (4/epsilon) ln(1/delta)); analyze_gauss takes the same params "
                    "and always runs."
                ),
                better_mechanism="analyze_gauss",
                docs=f"{DOCS}#gap_perturbation (and #choosing-a-mechanism)",
            )
        ]
    return []
