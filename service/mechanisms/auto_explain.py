"""How ``auto`` states its choice: the centring sentence of the dry run and the reason, and the
chosen mechanism's output labelled with ``auto_choice``, ``auto_reason`` (at most two
sentences), ``auto_details`` (every clause) and the budget it ran with. Public facts and
released outputs only."""

from __future__ import annotations

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


def summarise_reason(chosen: str, reason: str, clip: str = "") -> tuple[str, list[str]]:
    """At most two sentences (what ran and the first reason, with ``clip`` (the released clip,
    :func:`clip_clause`) when given, then the decisive last step when there was more than one)
    and every clause of ``reason`` (joined by ``"; "``), then ``clip``, as a list."""
    clauses = [clause.strip() for clause in reason.split("; ") if clause.strip()]
    head = clauses[0] if clauses else "chosen from public facts"
    sentence = head if head.startswith(chosen) else f"{chosen}: {head}"
    summary = sentence.rstrip(".") + ("; " + clip if clip else "") + "."
    if len(clauses) > 1 and ", so " in clauses[-1]:
        summary += " Then " + clauses[-1].rstrip(".") + "."
    return summary, clauses + ([clip] if clip else [])


def clip_clause(chosen: Chosen, extras: dict[str, Any]) -> str:
    """What the chosen ``analyze_gauss``'s private clip quantile released (``row_clip_norm``,
    a released output), so the reason does not claim a quantile clip that did not happen: at
    small ``n eps`` the grid's resolvable floor can leave ``C`` itself
    (:mod:`~service.mechanisms.clip_quantile`). ``""`` for anything else."""
    quantile = getattr(chosen.params, "quantile", None)
    bound = getattr(chosen.params, "clip_norm", None)
    row_clip = extras.get("row_clip_norm")
    if chosen.name != "analyze_gauss" or quantile is None or bound is None or row_clip is None:
        return ""
    # Which side of C, not the value: the value is row_clip_norm beside it (a noisy number
    # in a sentence would make every recorded reason differ run to run).
    if float(row_clip) < float(bound):
        return (
            f"the rows clipped at its private {quantile:g}-quantile's released clip "
            "(row_clip_norm), below C"
        )
    return (
        f"its private {quantile:g}-quantile released no clip below C (no grid edge its noise "
        "resolves at this n had few enough rows above): the rows clipped at C"
    )


def labelled(
    output: MechanismOutput, chosen: Chosen, reason: str, search: dict[str, Any] | None = None
) -> MechanismOutput:
    """The chosen mechanism's output with auto's choice, reason (with the released clip,
    :func:`clip_clause`) and the private steps' outcomes (never a noisy statistic: only
    decisions and released grid radii and clips)."""
    summary, details = summarise_reason(chosen.name, reason, clip_clause(chosen, output.extras))
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
