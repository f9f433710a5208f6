"""The queue term of a release's padding costs each job of the backlog a few arithmetic steps,
not a rate lookup: every release request sums it over every release not yet visible, under its
dataset's row lock.

Probed before the change (PostgreSQL, ``dpss api``, calibrated rates): with 5,000 releases not
yet visible a release request took 591 ms (median of 10; 49 ms with none), two thirds of it in
the per-job rate lookups (a sort of the calibrated points and a log interpolation, each job).
Counted, not timed: the rate is looked up once per distinct (mechanism, d), and the sum is the
same to the bit as the per-job computation it replaces.
"""

from __future__ import annotations

from service import padding
from service.padding import OVERHEAD, READ, CalibratedRates, PaddingModel


def _model() -> PaddingModel:
    rates = {
        ("analyze_gauss", 10): 2e8,
        ("analyze_gauss", 100): 1e9,
        ("analyze_gauss", 1000): 3e9,
        ("spectrum", 10): 2e8,
        ("spectrum", 100): 8e8,
        (OVERHEAD, 0): 1 / 0.012,
        (READ, 0): 4e8,
    }
    return PaddingModel(
        floor_seconds=1.0, multiplier=2.0, calibrated=CalibratedRates(rates, workers=2)
    )


def _backlog(jobs: int) -> list[tuple[str, int, int, int, dict[str, object]]]:
    shapes = [
        ("analyze_gauss", 300, 8, 2, {}),
        ("analyze_gauss", 5000, 50, 3, {}),
        ("spectrum", 300, 8, 2, {}),
        ("analyze_gauss", 300, 8, 4, {}),
    ]
    return [shapes[i % len(shapes)] for i in range(jobs)]


def test_the_queue_term_is_the_per_job_sum_to_the_bit():
    model = _model()
    ahead = _backlog(1001)
    expected = sum(
        model.overhead_multiplier * model.overhead_seconds(job[1], job[2])
        + model.calibrated_multiplier * model.run_seconds(*job)
        for job in ahead
    ) / max(model.calibrated.workers, 1)
    assert model.queue_seconds(ahead) == expected
    assert model.queue_seconds([]) == 0.0


def test_a_backlog_costs_one_rate_lookup_per_distinct_mechanism_and_dimension(monkeypatch):
    model = _model()
    calls = []
    looked_up = CalibratedRates.rate

    def counted(self: CalibratedRates, mechanism: str, d: int) -> float | None:
        calls.append((mechanism, d))
        return looked_up(self, mechanism, d)

    monkeypatch.setattr(padding.CalibratedRates, "rate", counted)
    model.queue_seconds(_backlog(2000))
    # Three distinct (mechanism, d) among 2,000 jobs; before: one lookup per job (2,000).
    assert len(calls) == len(set(calls)) == 3
