"""``auto`` on a dataset with ``privacy_unit_column`` (issue 34): every step per person.

``auto`` (:mod:`service.mechanisms.auto`) spends a share of epsilon on a private estimate
(the tail and the trace of the clipped ``X^T X``, each with ``Lap(2 C^2/eps_s)``), then runs
``analyze_gauss`` or ``friendly_aggregate`` (with a weight check and ``analyze_gauss`` stops).
Per person:

- **Estimate.** It reads the rows with each person's trace scaled to ``<= C^2``
  (:func:`~service.privacy_unit.bound_contributions`, trace rule). Each sum is a sum over
  people of a term in ``[0, C^2]`` (a person's tail under a fixed projector is at most their
  trace), so replacing one person moves each by ``<= C^2``: the row-level calibration, per
  person.
- **analyze_gauss** (its 0.3 clip quantile, and a centre if asked):
  :func:`~service.privacy_unit_centre.gauss_person_run` (one vector per person in a private
  mean, one value per person in the quantile, each person bounded on the centred rows).
- **friendly_aggregate**: its partition is of people (the unit index), so its search, its
  weight check (friendly's own weight: one person changes one subset, as one row did) and its
  test are per person; ``t <= n_units`` is a candidate filter in ``auto``'s plan.
- **smooth_sensitivity** (auto's choice when ``delta = 0``) has no person-level argument:
  refused with 422 naming ``privacy_unit_column`` before charging.

Sequential composition is unchanged (each step keeps its declared cost), so the total is the
declared ``(eps, delta)`` per person.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from service.mechanisms.auto import Auto
from service.mechanisms.auto_guard import Choice, PersonLevel
from service.mechanisms.base import MechanismOutput, ReleaseSpec
from service.mechanisms.components import component
from service.mechanisms.friendly_aggregate import FriendlyAggregate
from service.mechanisms.linalg import FloatArray
from service.privacy_unit import bound_contributions
from service.privacy_unit_centre import gauss_person_run


def person_level(
    data: npt.NDArray[Any], units: npt.NDArray[np.int64], clip_norm: float
) -> PersonLevel:
    """The per-person estimate rows and candidate runner ``auto`` uses on this dataset."""

    def structure_rows() -> FloatArray:
        return bound_contributions(data, units, clip_norm, "trace")

    def run(chosen: Choice, rows: FloatArray, k: int, rng: np.random.Generator) -> MechanismOutput:
        spec = chosen.spec(k)
        mechanism = component(chosen.name)
        if chosen.name == "analyze_gauss":
            # Any centre, with or without the quantile (auto's always has one): per person.
            return gauss_person_run(rows, units, spec, rng)
        if isinstance(mechanism, FriendlyAggregate):
            return mechanism.run(rows, spec, rng, units=units)
        # auto's plan offers nothing else on a person-level dataset.
        raise TypeError(f"{chosen.name} has no person-level run")

    return PersonLevel(units=units, structure_rows=structure_rows, run=run)


def run_auto(
    mechanism: Any,
    data: npt.NDArray[Any],
    units: npt.NDArray[np.int64],
    spec: ReleaseSpec[Any],
    rng: np.random.Generator,
) -> MechanismOutput:
    """Run ``auto`` per person; anything else is a caller's bug."""
    if not isinstance(mechanism, Auto):
        raise TypeError(f"{mechanism.name} is not auto")
    clip = spec.params.clip_norm
    assert clip is not None  # resolved by prepare
    return mechanism.run(data, spec, rng, person=person_level(data, units, clip))
