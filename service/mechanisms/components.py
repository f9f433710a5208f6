"""The one-shot mechanisms that :mod:`service.mechanisms.auto` composes, by name.

A layer below both ``auto`` and :mod:`service.mechanisms.registry`: ``auto`` looks its parts up
here, and the registry (which lists ``auto`` itself) imports ``auto``, so neither imports the
other in a cycle. The mechanisms are stateless, so these instances behave exactly like the
registry's.
"""

from __future__ import annotations

from typing import Any

from service.mechanisms.analyze_gauss import AnalyzeGauss
from service.mechanisms.base import Mechanism
from service.mechanisms.friendly_aggregate import FriendlyAggregate
from service.mechanisms.histogram_aggregate import HistogramAggregate
from service.mechanisms.smooth_sensitivity import SmoothSensitivity
from service.mechanisms.spatial_sign import SpatialSign

COMPONENTS: dict[str, Mechanism[Any]] = {
    mechanism.name: mechanism
    for mechanism in (
        AnalyzeGauss(),
        FriendlyAggregate(),
        HistogramAggregate(),
        SmoothSensitivity(),
        SpatialSign(),
    )
}


def component(name: str) -> Mechanism[Any]:
    """The mechanism called ``name`` that ``auto`` may run (a ``KeyError`` names a bug)."""
    return COMPONENTS[name]
