"""The mechanisms the service ships: adding one is one module and one line here."""

from __future__ import annotations

from typing import Any

from service.mechanisms.analyze_gauss import AnalyzeGauss
from service.mechanisms.auto import Auto
from service.mechanisms.base import Mechanism
from service.mechanisms.continual_gauss import ContinualGauss
from service.mechanisms.exact_gapmax import ExactGapMax
from service.mechanisms.friendly_aggregate import FriendlyAggregate
from service.mechanisms.gap_perturbation import GapPerturbation
from service.mechanisms.histogram_aggregate import HistogramAggregate
from service.mechanisms.smooth_sensitivity import SmoothSensitivity
from service.mechanisms.spatial_sign import SpatialSign
from service.mechanisms.spectrum import Spectrum

MECHANISMS: dict[str, Mechanism[Any]] = {
    mechanism.name: mechanism
    for mechanism in (
        AnalyzeGauss(),
        Auto(),
        ContinualGauss(),
        ExactGapMax(),
        FriendlyAggregate(),
        GapPerturbation(),
        HistogramAggregate(),
        SmoothSensitivity(),
        SpatialSign(),
        Spectrum(),
    )
}


def get_mechanism(name: str) -> Mechanism[Any] | None:
    """The registered mechanism called ``name``, or ``None``."""
    return MECHANISMS.get(name)
