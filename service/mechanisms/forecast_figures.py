"""What an earlier ``analyze_gauss`` release published that the dry run's forecast reads
(issue 32 item 4): :class:`ReleasedFigures`, built by the preview and read by
:mod:`service.mechanisms.gauss_release_forecast`. Post-processing of released figures and public
facts only."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class ReleasedFigures:
    """What an earlier ``analyze_gauss`` release on the same dataset published and the
    forecast reads (all released, so reading them is post-processing): its per-component
    ``ratios`` (empty where the release was hidden by noise and stated none) and their
    total's ``interval``, its noisy ``eigenvalues`` (descending), the
    trace of ``H + E``, the Gram noise's ``sigma`` (all in the Gram's units, scaled as
    released), ``d``, and the public ``n`` with the clip the Gram's rows had (``row_clip``,
    released; 0 when unknown: the spectrum is then read as unclipped)."""

    ratios: tuple[float, ...]
    interval: tuple[float, float]
    eigenvalues: tuple[float, ...]
    trace: float
    sigma: float
    n_cols: int
    n_rows: int = 0
    row_clip: float = 0.0
    uncentred: bool = False
    mean_noise: float = 0.0
    sums: float = 0.0
    #: The release's ``explained_variance_hidden_by_noise`` flag (also set where a low or high
    #: draw cut a narrow interval at 0 or 1 while its noise spans more).
    hidden: bool = False
    #: The release's ``explained_variance_split_hidden_by_noise`` flag: ``k = d`` with fewer
    #: components above the noise than released, so its total (1) is exact but it states no
    #: per-component split (``ratios`` empty): the forecast reads its spectrum instead.
    split_hidden: bool = False

    @classmethod
    def from_extras(
        cls,
        extras: Mapping[str, Any],
        n_cols: int,
        n_rows: int = 0,
        clip_norm: float = 0.0,
        mean_noise: float = 0.0,
    ) -> ReleasedFigures | None:
        """The figures of a release's extras, or ``None`` when one is missing (another
        mechanism, or a release from before the figures existed). ``clip_norm``: the
        request's ``C``, the Gram's clip when the extras name no ``row_clip_norm``;
        ``mean_noise``: the private mean's per-coordinate noise at the earlier request
        (public), kept when the release centred on a private mean (it released ``center``).
        ``uncentred``: the release took the route without centring (``centring: none``)."""
        hidden = extras.get("explained_variance_hidden_by_noise") is True
        flag = extras.get("explained_variance_split_hidden_by_noise")
        above = extras.get("components_above_noise")
        split_hidden = flag is True or (
            # A release from before the flag: k = d with fewer components above the noise.
            flag is None
            and isinstance(above, int)
            and not isinstance(above, bool)
            and len(extras.get("eigenvalues") or ()) >= n_cols
            and above < n_cols
        )
        try:
            stated = extras["explained_variance_ratio"]
            # A hidden share (or split) states no point (null): the ratios are read only where
            # the release measured them (:attr:`measured`), so none are needed then.
            withheld = hidden or split_hidden
            ratios = () if stated is None and withheld else tuple(float(x) for x in stated)
            low, high = (float(x) for x in extras["explained_variance_ratio_interval"])
            values = tuple(float(x) for x in extras["eigenvalues"])
            trace = float(extras["trace"])
            sigma = float(extras["gram_noise_std"])
            row_clip = float(extras.get("row_clip_norm", clip_norm))
        except (KeyError, TypeError, ValueError):
            return None
        if not values or ((ratios or not withheld) and len(ratios) != len(values)) or not sigma > 0:
            return None
        if not (math.isfinite(row_clip) and row_clip > 0):
            row_clip = 0.0
        uncentred = extras.get("centring") == "none"
        noise = mean_noise if "center" in extras else 0.0
        try:
            # The stored sums as drawn (a release shows them cut at 0, or null where its share
            # is hidden: shown_variance_extras); only their total is read, not their ratio.
            sums = float(extras["captured_sum_of_squares"]) + float(
                extras["residual_sum_of_squares"]
            )
        except (KeyError, TypeError, ValueError):
            sums = 0.0
        if not math.isfinite(sums):
            sums = 0.0
        return cls(
            ratios,
            (low, high),
            values,
            trace,
            sigma,
            n_cols,
            n_rows,
            row_clip,
            uncentred,
            noise,
            sums,
            hidden,
            split_hidden,
        )

    @property
    def measured(self) -> bool:
        """The release measured its share: its interval is narrower than
        :data:`~service.mechanisms.explained_variance.HIDDEN_WIDTH` and it was not flagged
        hidden by noise (a narrow interval cut at 0 or 1 is no measurement). The release's
        rule, not one of the forecast's: a share the release would not state (its point's mean
        absolute error above 0.05) is no measurement for the forecast to carry either, whose
        own error budget (within 0.1) the carried point's error would spend. A whole-space
        release whose split the noise hid (:attr:`split_hidden`) measured its total (1) but no
        per-component share, so there is none to carry either."""
        from service.mechanisms.explained_variance import HIDDEN_WIDTH  # no import cycle

        low, high = self.interval
        return (
            high - low < HIDDEN_WIDTH
            and not self.hidden
            and not self.split_hidden
            and bool(self.ratios)
        )

    @property
    def clipped_share(self) -> float:
        """``tr(H + E) / (n C2^2)`` clamped to ``[0, 1]``: how far the Gram's rows were
        clipped (1 when all were, the trace being ``n C2^2`` then; pairs: the trace is scaled
        to ``n`` rows). 0 when ``n`` or the clip is unknown."""
        if self.n_rows <= 0 or self.row_clip <= 0 or not self.trace > 0:
            return 0.0
        share = self.trace / (self.n_rows * self.row_clip**2)
        return min(max(share, 0.0), 1.0) if math.isfinite(share) else 0.0
