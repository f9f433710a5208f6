"""When an analyst may see a release's outcome: ``visible_at = created_at + padding``.

A mechanism's run time can depend on the data (``exact_gapmax`` took 0.1-0.5 s on one dataset
and 0.6-3.3 s on a neighbour differing in one row), and no noise covers it. So an analyst sees
no start or finish time and no outcome before ``visible_at``, and the padding is a function of
public facts fixed when the release is requested (the list below). Polling then reveals nothing
about the run time as long as the job ends within its padding; a job that ends later shows
only at a step of a fixed public schedule (:func:`late_schedule`).

**Uncalibrated** (no worker has calibrated this machine yet, or calibration is off)::

    padding = queue + max(floor, multiplier * work(mechanism, n, d, k, params) / rate(mechanism, d))

with ``queue`` the modelled time of the jobs ahead, as below (at the default rates and the
assumed overhead).

``work`` counts roughly the floating-point operations of the mechanism's dominant steps
(centring and a clip quantile included: the recommended PCA settings run 1.1-5x longer than the
defaults); ``rate`` converts them to seconds on the service's hardware: the public constants
:data:`DEFAULT_RATE_POINTS` (interpolated in ``log d``, measured on the reference class of
machine: 2 shared cores under load) or :data:`DEFAULT_RATES`; operators override them per
mechanism with ``DPSS_RELEASE_PADDING_RATES`` (one rate at every ``d``).

**Calibrated.** Once a worker has calibrated this machine (:mod:`service.calibration`: every
mechanism timed on public random data at a small and a larger ``d``, stored in
``machine_rates``), the padding tracks the measured rates instead of the conservative defaults::

    padding = calibrated_floor + overhead_multiplier * (overhead + 8 n d / read_rate)
              + queue + calibrated_multiplier * factor * work / rate(mechanism, d)

with ``overhead`` the slowest worker's per-job overhead and ``read_rate`` its rate of
reading a dataset file (both timed by a probe through the isolated path of a real job:
:func:`service.calibration.measure_overhead`); ``calibrated_floor`` a small constant for
what the probe does not see (an idle worker's wake-up); ``rate(mechanism, d)`` the slowest
worker's, interpolated in ``log d`` between the calibrated dimensions (clamped outside
them); ``queue`` the modelled time (overhead and run, each with its multiplier) of the
one-shot jobs *requested* before this one and not yet past their own ``visible_at``, shared
among the calibrated workers; and ``factor`` 1, except for a mechanism whose run time depends
on the data (``exact_gapmax``, ``auto``, ``histogram_aggregate``, ``friendly_aggregate``),
which is padded from its worst case at that shape as far as the model allows: ``work`` counts
every candidate ``exact_gapmax`` may score (rows in general position, none skipped) and the
costlier branch ``auto`` may choose, the calibration times them on the slowest of rows near a
subspace, isotropic rows and rows on a line (the aggregators' per-subset SVD route), and
:data:`DATA_DEPENDENT_FACTOR` adds margin on top.

**Every input, and why it is public** (fixed when the release is requested; none is a real
status, start, finish or run time of any job):

- this release's mechanism, ``k`` and resolved params, and the dataset's ``n`` (rows present
  at the request, which a one-shot release reads) and ``d``: public shape, the requester's own
  choices;
- the settings (floor, multipliers, operator rates) and the constants of this module: public;
- the calibrated rates (``machine_rates``): random public data timed by each worker **once, at
  its start, before it claims any job**, and not interrupted by the queue
  (:meth:`service.worker.Worker.calibrate_if_due`). They change only when an operator starts
  or stops a worker, never when a job ends (an idle worker recalibrating, or a calibration
  cut short by a queued job, would have published when jobs really ended). They are kept
  while the worker lives (its heartbeat row) and for :data:`service.calibration.STALE_AFTER`
  after; the number of calibrated workers counts the same rows;
- the queue term: the mechanism, shape and params of other one-shot releases with
  ``created_at <= now < visible_at``, both moments fixed when *they* were requested. Their
  real status (queued, running, finished), lease, start and finish are never read: a probe
  release's padding is the same whether another job is still running or already finished.
  A one-shot release past its ``visible_at`` whose outcome is not shown yet adds the time to
  its late schedule's next step (the latest of them): a public moment, the same whether it
  really runs or has ended and waits for that step (:func:`service.padding_queue.late_seconds`).
  So does a registration by reference requested before it whose end is not shown yet, until
  its next public moment (:func:`service.padding_queue.registration_seconds`): a worker may be
  reading its objects, for as long as they take. So does a continual release's first epoch
  not shown yet whose batch was committed before it, until the epoch's next public moment
  (:func:`service.padding_epochs.epoch_seconds`): a worker takes the epoch first.

``visible_at`` is computed once, when the release is requested, and stored: a later
calibration never moves it.

**Late jobs.** A job may still end after its ``visible_at`` (a loaded machine, a long queue).
What an analyst then sees is fixed by :func:`late_schedule`: the outcome of a job that ends
after ``visible_at`` is shown from the first step ``created_at + padding * 2^j`` (``j >= 1``)
at or after its real end, and until then the release is shown ``running`` (a fixed answer,
whatever the real state: not even the moment a worker claimed it shows). So lateness reveals
only ``j``, the number of doublings of the padding the job needed: at most
``log2(log2(cap / padding) + 1)`` bits (under 5 bits for any padding of a second or more and
the 30-day cap), and, as for any job, nothing at all when it ends within its padding.
Lateness is counted (``dpss_release_late_total`` by mechanism, and the operator's dashboard).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from service.config import Settings
from service.mechanisms.auto_gram import high_dimension

if TYPE_CHECKING:
    from service.db.models import Release

Params = Mapping[str, Any]
WorkModel = Callable[[int, int, int, Params], float]


def _eig(d: int) -> float:
    # A dense symmetric eigendecomposition with vectors costs about 9 d^3 flops.
    return 9.0 * d**3


def _gram(n: int, d: int) -> float:
    # H = X^T X in row chunks: n d^2 multiply-adds (the clip adds O(n d)).
    return float(n) * d * d + float(n) * d


def _int_param(params: Params, name: str, default: int) -> int:
    value = params.get(name)
    return int(value) if isinstance(value, int) and value > 0 else default


def _subset_svds(n: int, d: int, t: int) -> float:
    # t thin SVDs of (n/t) x d blocks: about 4 m d min(m, d) flops each.
    m = max(n // max(t, 1), 1)
    return t * 4.0 * m * d * min(m, d)


#: Work units per element of an elementwise pass over the rows (a clip, a centring, a copy, a
#: norm): such passes run far below the Gram's BLAS rate the rates are calibrated on. Measured
#: on the reference machine (``bench/bench_visible_latency.py`` cases ``pca``): a private centre
#: added 0.11 s and a clip quantile 0.24 s more to a 0.14 s 20,000 x 50 ``analyze_gauss``.
ELEMENTWISE_WORK = 50.0


def _centring(n: int, d: int, params: Params) -> float:
    # A private mean's clipped pass, the centred copy and its second clip: elementwise passes.
    return ELEMENTWISE_WORK * n * d if params.get("center", "none") != "none" else 0.0


def _clip_quantile(n: int, d: int, params: Params) -> float:
    # The private clip quantile: the rows' norms over the quantile grid's probe histograms, the
    # pairing copy clipped to the chosen norm (two elementwise passes) and the second Gram pass
    # on it.
    if params.get("clip_quantile") is None:
        return 0.0
    return 2.0 * ELEMENTWISE_WORK * n * d + _gram(n, d)


def _pca_options(n: int, d: int, params: Params) -> float:
    return _centring(n, d, params) + _clip_quantile(n, d, params)


def _analyze_gauss(n: int, d: int, k: int, params: Params) -> float:
    # The Gram pass and the eigensolver, plus the centring and the clip quantile when asked for.
    return _gram(n, d) + _eig(d) + _pca_options(n, d, params)


def _continual_gauss(n: int, d: int, k: int, params: Params) -> float:
    # One epoch on a batch of n rows: its Gram pass, at most L = floor(log2 T) + 1 closing
    # nodes (a noise draw and a combination each, d^2) with the old and new state (4 L d^2),
    # and the eigensolver.
    levels = max(1, _int_param(params, "horizon", 1)).bit_length()
    return _gram(n, d) + _eig(d) + 8.0 * levels * d * d


def _gap_perturbation(n: int, d: int, k: int, params: Params) -> float:
    # eigh of H, then eigh of the noisy projector W.
    return _gram(n, d) + 2 * _eig(d) + _pca_options(n, d, params)


def _smooth_sensitivity(n: int, d: int, k: int, params: Params) -> float:
    return _gram(n, d) + _eig(d) + 4.0 * d * k * k + _pca_options(n, d, params)


def _spatial_sign(n: int, d: int, k: int, params: Params) -> float:
    # The private mean's pass, the sign Gram pass (a few elementwise passes over each chunk
    # besides the rank update) and the eigensolver; with a centre, the explained-variance
    # pass (X U, n d k, and the rows' norms).
    centred = params.get("center", "private") != "none"
    return _gram(n, d) + _eig(d) + 6.0 * n * d + (2.0 * n * d * (k + 2) if centred else 0.0)


def _spectrum(n: int, d: int, k: int, params: Params) -> float:
    return _gram(n, d) + _eig(d) + _pca_options(n, d, params)


def _histogram_aggregate(n: int, d: int, k: int, params: Params) -> float:
    t = _int_param(params, "t", max(n // max(10 * k, 1), 1))
    q = _int_param(params, "q", 2 * k)
    rounds = 2 if params.get("boost_beta") is not None else 1
    # Per subset: an SVD, then q projections of d-vectors onto the k-dim subspace.
    return rounds * (_subset_svds(n, d, t) + t * 2.0 * q * d * k)


def _friendly_aggregate(n: int, d: int, k: int, params: Params) -> float:
    t = _int_param(params, "t", max(n // max(10 * k, 1), 1))
    q = _int_param(params, "q", 2 * k)
    points = _subset_svds(n, d, t) + t * 2.0 * q * d * k
    # Pairwise distances of t points in R^{q d}, by direct differences, once per step of the
    # radius search (at most 64 steps: one per binary exponent tried).
    return points + 64.0 * t * t * q * d


def _exact_gapmax(n: int, d: int, k: int, params: Params) -> float:
    n0 = _int_param(params, "sample_rows", n)
    # Every k-subset of the sample is a candidate, and membership of each sampled row is
    # tested against it: C(n0, k) n0 d (the mechanism's own compute cap uses this count).
    try:
        candidates = float(math.comb(n0, k))
    except OverflowError:
        candidates = 1e300  # beyond any rate: the padding is capped below
    return candidates * n0 * d + _eig(d)


def _auto(n: int, d: int, k: int, params: Params) -> float:
    # The structure test (Gram and all eigenvalues), then the costlier of the two candidates it
    # chooses between (the choice is private, so the padding covers either). For delta = 0 this
    # overestimates smooth_sensitivity's work, which only lengthens the padding.
    # Its Gram candidate runs with a clip quantile (service.mechanisms.auto), and with the
    # centring asked for; in high dimension it is spatial_sign.
    gram = _analyze_gauss(n, d, k, {**params, "clip_quantile": True})
    if high_dimension(n, d):
        # Its Gram candidate is then spatial_sign, or analyze_gauss where a private centre's
        # error would stand out at this budget (public facts; auto_gram): cover either.
        gram = max(gram, _spatial_sign(n, d, k, params))
    test = _gram(n, d) + _eig(d)
    return test + max(gram, _friendly_aggregate(n, d, k, {}))


WORK_MODELS: dict[str, WorkModel] = {
    "auto": _auto,
    "analyze_gauss": _analyze_gauss,
    "continual_gauss": _continual_gauss,
    "gap_perturbation": _gap_perturbation,
    "smooth_sensitivity": _smooth_sensitivity,
    "spectrum": _spectrum,
    "spatial_sign": _spatial_sign,
    "histogram_aggregate": _histogram_aggregate,
    "friendly_aggregate": _friendly_aggregate,
    "exact_gapmax": _exact_gapmax,
}

#: Work units per second, from ``bench/bench_padding.py`` on the reference machine (2 cores,
#: x86-64, numpy with OpenBLAS, under load from other processes), then lowered: a lower rate
#: only lengthens the padding. Measured (work/s at n x d = 20,000 x 50 and 50,000 x 200):
#: Gram-and-eigh mechanisms 1e8 to 3e9; histogram_aggregate 8.5e7 to 2.4e8 (Python work per
#: subset); friendly_aggregate 4.5e9 to 1.2e10 (the 64-step term is an upper bound);
#: exact_gapmax 1.2e8 on rows in general position (its worst case; the exact-arithmetic
#: version is slower per unit: recalibrate after changing it).
#: The Gram mechanisms' rate grows with ``d`` (BLAS-3 at large ``d``, memory-bound at small):
#: their rates are :data:`DEFAULT_RATE_POINTS`, and the value here is the one at large ``d``.
DEFAULT_RATES: dict[str, float] = {
    # The slower of its candidates' rates (analyze_gauss), applied to the larger work.
    "auto": 1e9,
    "analyze_gauss": 2e9,
    # Per epoch (each epoch is padded on its own batch): Gram and eigh; an epoch measured 1.2x
    # one analyze_gauss run on the same batch (docs/mechanisms.md, continual_gauss).
    "continual_gauss": 5e8,
    "gap_perturbation": 2e9,
    "smooth_sensitivity": 2e9,
    "spectrum": 2e9,
    "spatial_sign": 2e9,
    "histogram_aggregate": 5e7,
    "friendly_aggregate": 1e9,
    "exact_gapmax": 2e7,
}
#: ``(d, rate)`` points of the uncalibrated rate, interpolated in ``log d`` as calibrated rates
#: are (clamped outside them). Measured on the reference class of machine (2 shared cores under
#: a load average of 4.5, ``analyze_gauss``): 3.6e8 work/s at 20,000 x 50, 2.9e9 at 2,000 x 300,
#: 3.1e9 at 3,500 x 784 (2.1 s, against 0.5 s quiet), then lowered. So a fresh service's first
#: release at 3,500 x 784 waits 13 s for its outcome rather than 52 s under the former flat
#: 5e8, and a 20,000 x 50 one the 5 s floor; a small ``d`` gets a lower rate than before.
DEFAULT_RATE_POINTS: dict[str, tuple[tuple[int, float], ...]] = {
    **{
        name: ((10, 5e7), (50, 2e8), (300, 1e9), (800, 2e9))
        for name in (
            "analyze_gauss",
            "gap_perturbation",
            "smooth_sensitivity",
            "spectrum",
            "spatial_sign",
        )
    },
    "auto": ((10, 5e7), (50, 2e8), (300, 1e9)),
}
#: For a mechanism with neither a model nor a rate (a newly added one): Gram plus eigh, slowly.
FALLBACK_RATE = 1e8
#: Extra safety on a calibrated padding for mechanisms whose run time depends on the data (the
#: candidates exact_gapmax scores, the branch auto's private test picks, the occupied cells of
#: histogram_aggregate's grid, and both aggregators' subset decomposition: a block without a
#: certified gap takes a dense ``eigh``, a rank-deficient one its own SVD,
#: :mod:`service.mechanisms.subset_top_k`): the calibration times them on the kinds of data
#: :data:`service.calibration.DATA_KINDS` and keeps the slowest, and a late job would reveal
#: something about the data.
DATA_DEPENDENT_FACTOR: dict[str, float] = {
    "exact_gapmax": 2.0,
    "auto": 2.0,
    "histogram_aggregate": 2.0,
    "friendly_aggregate": 2.0,
}


#: Pseudo-mechanisms of ``machine_rates`` (at ``d = 0``): the per-job overhead of the isolated
#: path, stored as ``1 / seconds`` (the slower rate is the longer overhead), and the rate of
#: reading a dataset file, bytes per second (:func:`service.calibration.measure_overhead`).
OVERHEAD = "_overhead"
READ = "_read"
#: The per-job overhead assumed while no worker has timed it (workers calibrated before the
#: probe existed), with the overhead multiplier: 0.25 + 2 x 0.75 s, the former constant's 1.5 s
#: and a little more.
UNCALIBRATED_OVERHEAD_SECONDS = 0.75
#: The read rate assumed while no worker has timed it, bytes per second (a slow disk).
UNCALIBRATED_READ_RATE = 1e8


#: The longest padding: a timedelta cannot hold arbitrary floats, and a job that needs a month
#: is refused by the memory gate or the mechanisms' compute caps long before.
MAX_PADDING_SECONDS = 30 * 24 * 3600.0


def padded(release: Release) -> bool:
    """Whether the release has a padding to keep (a zero padding, switched off, hides nothing:
    the real state shows, as :func:`late_schedule` shows a late outcome at once then)."""
    return release.visible_at is not None and release.visible_at > release.created_at


def late_schedule(
    created_at: datetime, visible_at: datetime, ended_at: datetime
) -> tuple[datetime, int]:
    """When an analyst may see the outcome of a job requested at ``created_at``, padded to
    ``visible_at``, that really ended at ``ended_at``; and the step ``j`` it shows at.

    ``visible_at`` (``j = 0``) if it ended by then; else the first step
    ``created_at + padding * 2^j`` (``j >= 1``) at or after ``ended_at``, a schedule fixed at
    the request from public facts only. So a late job reveals ``j`` and nothing finer: at most
    ``log2(J + 1)`` bits for ``J`` steps within reach. A zero padding (padding switched off)
    hides nothing: the outcome shows when it ends.
    """
    padding = visible_at - created_at
    if ended_at <= visible_at:
        return visible_at, 0
    if padding <= timedelta(0):
        return ended_at, 0
    # The smallest j >= 1 with created_at + padding * 2^j >= ended_at, from the float estimate
    # then corrected by exact timedelta comparisons (float rounding must not show a step early).
    ratio = (ended_at - created_at) / padding
    step = max(1, math.ceil(math.log2(ratio)) - 1)
    while created_at + padding * 2**step < ended_at:
        step += 1
    while step > 1 and created_at + padding * 2 ** (step - 1) >= ended_at:
        step -= 1
    return created_at + padding * 2**step, step


def next_late_step(created_at: datetime, visible_at: datetime, now: datetime) -> datetime:
    """The first step of the late schedule (:func:`late_schedule`) strictly after ``now``: until
    then, what an analyst is shown of a release past its ``visible_at`` cannot change."""
    padding = visible_at - created_at
    if padding <= timedelta(0):
        return now  # nothing is hidden
    shown, _ = late_schedule(created_at, visible_at, now)
    return shown if shown > now else late_schedule(created_at, visible_at, now + padding)[0]


def work_units(mechanism: str, n: int, d: int, k: int, params: Params) -> float:
    """Modelled work units of one run (about floating-point operations)."""
    return WORK_MODELS.get(mechanism, _analyze_gauss)(n, d, k, params)


@dataclass(frozen=True)
class CalibratedRates:
    """Measured rates ``{(mechanism, d): work units per second}`` and how many workers measured
    them (the slowest worker's rate per key; see :func:`service.calibration.current_rates`)."""

    rates: Mapping[tuple[str, int], float] = field(default_factory=dict)
    workers: int = 0

    @property
    def overhead_seconds(self) -> float | None:
        """The slowest recent worker's per-job overhead; ``None`` if none was timed."""
        rate = self.rates.get((OVERHEAD, 0))
        return None if rate is None else 1.0 / rate

    @property
    def read_rate(self) -> float | None:
        """The slowest recent worker's rate of reading a dataset file, bytes per second."""
        return self.rates.get((READ, 0))

    def rate(self, mechanism: str, d: int) -> float | None:
        """The rate at ``d``: interpolated in ``log d`` between the calibrated dimensions,
        the nearest one's outside them; ``None`` if the mechanism was not calibrated."""
        points = sorted(
            (dim, rate) for (name, dim), rate in self.rates.items() if name == mechanism
        )
        if not points:
            return None
        if d <= points[0][0]:
            return points[0][1]
        for (d0, r0), (d1, r1) in itertools.pairwise(points):
            if d <= d1:
                t = (math.log(d) - math.log(d0)) / (math.log(d1) - math.log(d0))
                return math.exp((1 - t) * math.log(r0) + t * math.log(r1))
        return points[-1][1]


@dataclass(frozen=True)
class PaddingModel:
    """``padding = max(floor, multiplier * work / rate)`` uncalibrated; calibrated, the sum in
    the module's docstring. Every input is public."""

    floor_seconds: float
    multiplier: float
    rates: Mapping[str, float] = field(default_factory=lambda: dict(DEFAULT_RATES))
    calibrated: CalibratedRates = field(default_factory=CalibratedRates)
    calibrated_floor_seconds: float = 0.25
    calibrated_multiplier: float = 2.5
    overhead_multiplier: float = 2.0

    @classmethod
    def from_settings(
        cls, settings: Settings, calibrated: CalibratedRates | None = None
    ) -> PaddingModel:
        return cls(
            floor_seconds=settings.release_padding_floor_seconds,
            multiplier=settings.release_padding_multiplier,
            rates={**DEFAULT_RATES, **settings.release_padding_rates},
            # Operators' explicit rates win over the calibration; so does turning it off.
            calibrated=(
                calibrated
                if calibrated is not None and settings.release_padding_calibrated
                else CalibratedRates()
            ),
            calibrated_floor_seconds=settings.release_padding_calibrated_floor_seconds,
            calibrated_multiplier=settings.release_padding_calibrated_multiplier,
            overhead_multiplier=settings.release_padding_overhead_multiplier,
        )

    def work(self, mechanism: str, n: int, d: int, k: int, params: Params) -> float:
        """Modelled work units of one run (about floating-point operations)."""
        return work_units(mechanism, n, d, k, params)

    def _calibrated_rate(self, mechanism: str, d: int) -> float | None:
        return None if mechanism in self.overridden else self.calibrated.rate(mechanism, d)

    @property
    def overridden(self) -> set[str]:
        return {name for name, rate in self.rates.items() if DEFAULT_RATES.get(name) != rate}

    def default_rate(self, mechanism: str, d: int) -> float:
        """The uncalibrated rate at ``d``: the operator's if set, else the public constants
        (:data:`DEFAULT_RATE_POINTS` interpolated in ``log d``, or :data:`DEFAULT_RATES`)."""
        points = DEFAULT_RATE_POINTS.get(mechanism)
        if points is not None and mechanism not in self.overridden:
            rate = CalibratedRates({(mechanism, dim): value for dim, value in points}).rate(
                mechanism, max(d, 1)
            )
            assert rate is not None  # the points are not empty
            return rate
        return self.rates.get(mechanism, FALLBACK_RATE)

    def rate_at(self, mechanism: str, d: int) -> float:
        """The rate a run of ``mechanism`` at ``d`` is modelled at: calibrated if it can be,
        else the default."""
        return self._calibrated_rate(mechanism, d) or self.default_rate(mechanism, d)

    def run_seconds(self, mechanism: str, n: int, d: int, k: int, params: Params) -> float:
        """The modelled run time on this machine: calibrated if it can be, else the default."""
        return self.work(mechanism, n, d, k, params) / self.rate_at(mechanism, d)

    def overhead_seconds(self, n: int, d: int) -> float:
        """The modelled per-job overhead of a run on ``n x d`` rows: the probe's overhead plus
        reading ``8 n d`` bytes at the probe's read rate (assumed values while uncalibrated)."""
        overhead = self.calibrated.overhead_seconds
        read_rate = self.calibrated.read_rate or UNCALIBRATED_READ_RATE
        if overhead is None:
            overhead = UNCALIBRATED_OVERHEAD_SECONDS
        return overhead + 8.0 * n * d / read_rate

    def padding(
        self, mechanism: str, n: int, d: int, k: int, params: Params, queue_seconds: float = 0.0
    ) -> timedelta:
        """The delay after the request before an analyst may see the outcome.

        ``queue_seconds``: the modelled time of the jobs ahead (:meth:`queue_seconds`),
        added with or without a calibration: the defaults' floor does not cover a long job
        ahead, and a job padded as if it were not there would show late exactly when that job
        had not yet ended.
        """
        rate = self._calibrated_rate(mechanism, d)
        work = self.work(mechanism, n, d, k, params)
        if rate is not None:
            factor = self.calibrated_multiplier * DATA_DEPENDENT_FACTOR.get(mechanism, 1.0)
            overhead = self.overhead_multiplier * self.overhead_seconds(n, d)
            seconds = (
                self.calibrated_floor_seconds + overhead + queue_seconds + factor * work / rate
            )
        else:
            seconds = max(
                self.floor_seconds, self.multiplier * work / self.default_rate(mechanism, d)
            )
            # A zero padding is padding switched off (nothing hidden): no queue term then.
            seconds += queue_seconds if seconds > 0 else 0.0
        # Capped at 30 days: a timedelta cannot hold arbitrary floats, and a job that needs a
        # month is refused by the memory gate or the mechanisms' compute caps long before.
        return timedelta(seconds=min(seconds, MAX_PADDING_SECONDS))

    def queue_seconds(self, ahead: list[tuple[str, int, int, int, Params]]) -> float:
        """Time the calibrated workers need for the jobs ``ahead`` (mechanism, n, d, k,
        params), each at its padding's multiples of its modelled overhead and run, shared among
        them."""
        # Every release request sums over the whole backlog (under its dataset's row lock), so
        # the per-job cost is what a backlog multiplies: a rate (a sort of the calibrated
        # points, an interpolation) and an overhead depend only on (mechanism, d) and (n, d),
        # few distinct values, each computed once here. The terms and their order are the
        # same as computing each job in full, so the sum is the same to the bit.
        rates: dict[tuple[str, int], float] = {}
        overheads: dict[tuple[int, int], float] = {}
        total = 0.0
        for mechanism, n, d, k, params in ahead:
            rate = rates.get((mechanism, d))
            if rate is None:
                rate = rates[(mechanism, d)] = self.rate_at(mechanism, d)
            overhead = overheads.get((n, d))
            if overhead is None:
                overhead = overheads[(n, d)] = self.overhead_seconds(n, d)
            total += self.overhead_multiplier * overhead + self.calibrated_multiplier * (
                self.work(mechanism, n, d, k, params) / rate
            )
        return total / max(self.calibrated.workers, 1)
