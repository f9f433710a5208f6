"""How ``auto`` states its choice: the centring sentence of the dry run and the reason, and the
chosen mechanism's output labelled with ``auto_choice``, ``auto_reason`` (at most two
sentences), ``auto_details`` (every clause) and the budget it ran with. Public facts and
released outputs only."""

from __future__ import annotations

import math
from typing import Any, Protocol

from service.mechanisms.analyze_gauss import DEFAULT_PRIVATE_CENTRE_QUANTILE
from service.mechanisms.auto_gram import alternative_gram
from service.mechanisms.base import (
    MechanismOutput,
    MechanismParams,
    PreviewValue,
    PublicContext,
    ReleaseSpec,
    resolve_clip_norm,
)
from service.mechanisms.centring import CenterParams
from service.mechanisms.clip_quantile import resolvable_floor
from service.mechanisms.gauss_calibration import AnalyzeGaussParams, chooses_centring, gauss_split


class Chosen(Protocol):
    """What ran: a registered mechanism's name, its resolved params and its budget."""

    @property
    def name(self) -> str: ...
    @property
    def params(self) -> MechanismParams: ...
    @property
    def epsilon(self) -> float: ...
    @property
    def delta(self) -> float: ...


def centring_sentence(params: CenterParams, delta: float, gram: str = "analyze_gauss") -> str:
    """What auto's choice does about centring (issue 32, item 1); ``gram``: its Gram
    candidate."""
    quantile = f"{DEFAULT_PRIVATE_CENTRE_QUANTILE:g}"
    if params.center == "none":
        return (
            'not centred (center "none", the default of every mechanism): the subspace of '
            "X^T X, the second-moment matrix, which the aggregators estimate too; for PCA send "
            '"params": {"center": "private"} (PrivatePCA does by default), and auto then centres'
        )
    if delta == 0:
        if params.center == "private":
            return (
                "PCA requested: smooth_sensitivity centres on a private mean (Laplace noise, "
                "center_share of epsilon); it has no private clip quantile"
            )
        return "PCA requested: smooth_sensitivity centres on the given public centre (no budget)"
    if gram == "spatial_sign":
        if params.center == "private":
            head, where = 'PCA requested (center "private")', "a private mean (center_share)"
        else:
            head, where = "PCA requested (a public centre)", "it (no budget)"
        return (
            f"{head}: spatial_sign centres on {where} and scales each centred row to the norm "
            "bound (no clip to choose)"
        )
    if params.center == "private":
        return (
            'PCA requested (center "private"): analyze_gauss clips the rows at a private '
            f"{quantile}-quantile of their norms and chooses the centring route (the private "
            "mean, differences of publicly paired rows, or none) from a private probe, within "
            "the same budget"
        )
    return (
        "PCA requested (a public centre): analyze_gauss centres on it (no budget) and clips the "
        f"centred rows at a private {quantile}-quantile of their norms"
    )


def choice_notes(
    ctx: PublicContext,
    spec: ReleaseSpec[Any],
    chosen: str,
    summary: str,
    scales: dict[str, PreviewValue],
) -> list[str]:
    """The dry run's lines after auto's choice (issue 32, item 1): the centring sentence where
    the summary does not hold it, and for a centred request in high dimension what the other
    Gram candidate would use and what it kept where measured (its figures added to
    ``scales``); ``spec.params``: auto's (a :class:`CenterParams`)."""
    params: CenterParams = spec.params
    epsilon, delta, k = spec.epsilon, spec.delta, spec.k
    centring = centring_sentence(params, delta, chosen)
    lines = [] if centring in summary else [centring[0].upper() + centring[1:] + "."]
    clip = resolve_clip_norm(params.clip_norm, ctx)
    other = None if delta == 0 else alternative_gram(ctx, params, clip, epsilon, delta, k, chosen)
    if other is not None:
        scales.update(other[0])
        lines.append(other[1])
    return lines


def summarise_reason(chosen: str, reason: str) -> tuple[str, list[str]]:
    """At most two sentences (what ran and the first reason, then the decisive last step when
    there was more than one) and every clause of ``reason`` (joined by ``"; "``) as a list."""
    clauses = [clause.strip() for clause in reason.split("; ") if clause.strip()]
    head = clauses[0] if clauses else "chosen from public facts"
    sentence = head if head.startswith(chosen) else f"{chosen}: {head}"
    summary = sentence.rstrip(".") + "."
    if len(clauses) > 1 and ", so " in clauses[-1]:
        summary += " Then " + clauses[-1].rstrip(".") + "."
    return summary, clauses


def clip_clause(extras: dict[str, Any], n: int) -> str:
    """What the chosen ``analyze_gauss``'s private clip quantile released, from ``row_clip_norm``
    (a released output) and public facts (``n``: rows, or people on a person-level dataset; the
    budget it ran with), so the reason does not claim a quantile clip the noise did not give:
    below :func:`~service.mechanisms.clip_quantile.resolvable_floor` the released clip may be a
    noise reading far below the rows' norms (at small ``n eps``: 300 rows of norms 0.5-0.8 at
    eps 0.2 were clipped at 0.0023). Which side of ``C`` and of the floor, not the value: the
    value is ``row_clip_norm`` beside it (a noisy number in the sentence would make every
    recorded reason differ run to run). ``""`` for anything else."""
    raw = extras.get("auto_params")
    row_clip = extras.get("row_clip_norm")
    if extras.get("auto_choice") != "analyze_gauss" or raw is None or row_clip is None:
        return ""
    params = AnalyzeGaussParams.model_validate(raw)
    quantile, bound = params.quantile, params.clip_norm
    if quantile is None or bound is None:
        return ""
    if float(row_clip) >= float(bound):
        return f"its private {quantile:g}-quantile released no clip below C: the rows clipped at C"
    split = gauss_split(float(extras["auto_epsilon"]), float(extras["auto_delta"]), params)
    # The counts' noise as analyze_gauss draws it (the probe's: sqrt(2) times the std).
    mu = split.clip_mu / math.sqrt(2.0) if chooses_centring(params) else split.clip_mu
    floor = resolvable_floor(float(bound), n, quantile, mu)
    said = f"the rows clipped at its private {quantile:g}-quantile's released clip (row_clip_norm)"
    if float(row_clip) >= floor:
        return said + ", below C"
    where = (
        f"where its noise resolves no grid edge below C at n = {n} and this budget"
        if floor >= float(bound)
        else f"below {floor / float(bound):.3g} C, the lowest grid edge its noise resolves at "
        f"n = {n} and this budget"
    )
    return (
        f"{said}, {where}: possibly a noise reading far below the rows' norms, which then "
        "weights every row alike, like spatial_sign"
    )


def with_clip(output: MechanismOutput, n: int) -> MechanismOutput:
    """``output`` (:func:`labelled`) with :func:`clip_clause` in ``auto_reason`` (its first
    sentence) and last in ``auto_details``; unchanged when there is no clip to state."""
    clause = clip_clause(output.extras, n)
    if not clause:
        return output
    reason = str(output.extras["auto_reason"])
    first, dot, rest = reason.partition(". Then ")
    first = first.rstrip(".") + "; " + clause + "."
    output.extras["auto_reason"] = first + (" Then " + rest if dot else "")
    output.extras["auto_details"] = [*output.extras["auto_details"], clause]
    return output


def labelled(
    output: MechanismOutput, chosen: Chosen, reason: str, search: dict[str, Any] | None = None
) -> MechanismOutput:
    """The chosen mechanism's output with auto's choice, reason and the private steps' outcomes
    (never a noisy statistic: only decisions and released grid radii)."""
    summary, details = summarise_reason(chosen.name, reason)
    output.extras = {
        **output.extras,
        "auto_choice": chosen.name,
        "auto_reason": summary,
        "auto_details": details,
        "auto_params": chosen.params.model_dump(mode="json"),
        "auto_epsilon": chosen.epsilon,
        "auto_delta": chosen.delta,
        **({} if search is None else {"auto_search": search}),
    }
    return output
