"""Issue 34, sample-and-aggregate per person: the partition of people (all rows of a person in
one subset, subsets trimmed or padded to the public ``m``), one replaced person changing one
subset's basis, the request gate's ``t <= n_units``, and an empirical audit of
``histogram_aggregate`` whose neighbours differ in one person with 20 rows, with the same
mechanism partitioning rows as the negative control the audit catches."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from service.errors import InvalidInput
from service.mechanisms.base import PublicContext, ReleaseSpec
from service.mechanisms.friendly_aggregate import FriendlyAggregate, FriendlyAggregateParams
from service.mechanisms.histogram_aggregate import HistogramAggregate, HistogramAggregateParams
from service.mechanisms.sample_aggregate import partition_and_bases, random_partition
from service.privacy_unit import check_mechanism, check_partition, partition_bytes
from tests.mechanisms.privacy_audit import audit


def units_of(rows_each: list[int], rng: np.random.Generator) -> np.ndarray:
    """Person labels (sparse, shuffled over the rows) for people of the given row counts."""
    labels = rng.choice(10 * len(rows_each), size=len(rows_each), replace=False)
    units = np.repeat(labels, rows_each)
    return units[rng.permutation(units.size)].astype(np.int64)


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("t", [1, 7, 30])
def test_a_persons_rows_land_in_one_subset_and_subsets_have_m_rows(seed: int, t: int) -> None:
    rng = np.random.default_rng(seed)
    rows_each = rng.integers(1, 21, size=40).tolist()
    units = units_of(rows_each, rng)
    n = units.size
    partition = random_partition(n, t, rng, units)
    assert partition.shape == (t, n // t)
    assert np.all(np.diff(partition, axis=1) >= 0)  # sorted: a memory map is read in order
    owner: dict[int, int] = {}
    people_per_subset = []
    for j, subset in enumerate(partition):
        people = set(units[subset].tolist())
        people_per_subset.append(len(people))
        for person in people:
            assert owner.setdefault(person, j) == j, "a person's rows are in two subsets"
        # Padding repeats the subset's own rows only; a subset below m repeats them all.
        if len(set(subset.tolist())) < subset.size:
            assert set(subset.tolist()) == set(np.flatnonzero(np.isin(units, list(people))))
    # floor(P/t) or ceil(P/t) people per subset (fewer only if trimming dropped one entirely).
    assert max(people_per_subset) <= -(-40 // t)


def test_every_person_is_assigned_and_the_subset_counts_are_balanced() -> None:
    rng = np.random.default_rng(3)
    units = units_of([1] * 50, rng)  # one row each: nothing trimmed or padded
    partition = random_partition(50, 7, rng, units)
    assert partition.shape == (7, 7)
    # 50 people in 7 subsets: 7 or 8 each, trimmed to m = 7 rows: 49 distinct rows.
    assert len(set(partition.ravel().tolist())) == 49


def test_without_groups_the_partition_is_the_row_partition_of_before() -> None:
    n, t = 103, 9
    got = random_partition(n, t, np.random.default_rng(4))
    expected = np.sort(np.random.default_rng(4).permutation(n)[: t * (n // t)].reshape(t, -1), 1)
    np.testing.assert_array_equal(got, expected)


def test_a_partition_of_people_needs_a_person_per_subset() -> None:
    with pytest.raises(ValueError, match="number of people"):
        random_partition(10, 4, np.random.default_rng(0), np.array([0] * 5 + [1] * 5))


def test_replacing_one_persons_rows_changes_one_subset_basis() -> None:
    """Same units, same generator: the partition is the same, and a person of 20 rows whose
    rows change (to anything: 1e300, zeros) moves exactly the basis of their own subset."""
    rng = np.random.default_rng(8)
    units = units_of([20, *rng.integers(1, 6, size=59).tolist()], rng)
    counts = {u: int(np.sum(units == u)) for u in set(units.tolist())}
    person = next(u for u, c in counts.items() if c == 20)
    data = rng.standard_normal((units.size, 5))
    t, k = 15, 2
    partition, bases = partition_and_bases(data, t, k, np.random.default_rng(1), units)
    (home,) = {j for j in range(t) if np.any(units[partition[j]] == person)}
    for replacement in (1e300, 0.0, -3.0):
        other = data.copy()
        other[units == person] = replacement * np.ones(5)
        again, moved = partition_and_bases(other, t, k, np.random.default_rng(1), units)
        np.testing.assert_array_equal(again, partition)
        changed = {j for j in range(t) if not np.array_equal(bases[j], moved[j])}
        assert changed <= {home}
        assert np.all(np.isfinite(moved))


def test_the_gate_refuses_more_subsets_than_people_and_admits_the_partitioned() -> None:
    check_mechanism("friendly_aggregate", FriendlyAggregateParams(t=10), False)
    check_mechanism("histogram_aggregate", HistogramAggregateParams(t=10), False)
    check_partition("friendly_aggregate", FriendlyAggregateParams(t=10), 10)
    with pytest.raises(InvalidInput) as refused:
        check_partition("friendly_aggregate", FriendlyAggregateParams(t=11), 10)
    assert refused.value.field == "t"
    boosted = HistogramAggregateParams(t=10, boost_beta=0.1, boost_alpha=0.1)
    with pytest.raises(InvalidInput) as refused:
        check_partition("histogram_aggregate", boosted, 10_000)
    assert refused.value.field == "boost_beta"
    # auto is per person since issue 34's auto step (service.privacy_unit_auto); a mechanism
    # without a person-level argument is still refused.
    check_mechanism("auto", None, False)
    with pytest.raises(InvalidInput):
        check_mechanism("exact_gapmax", None, False)


def test_the_memory_estimate_bounds_the_partition_of_people() -> None:
    import tracemalloc

    n = 200_000
    units = (np.arange(n) % 5000).astype(np.int64)
    rng = np.random.default_rng(2)
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        random_partition(n, 100, rng, units)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak <= partition_bytes(n)


# ---------------------------------------------------------------------------------------------
# Empirical audit: neighbours differ in one person with 20 rows.
#
# histogram_aggregate with a public cell width (the whole epsilon on the histogram), k = 1 in
# d = 3. Neutral people (1-5 Gaussian rows each) give subsets of scattered directions, one per
# cell; 8 people of one row 1e6 e2 make about 7 subsets whose basis is e2, all in one cell, a
# little under the threshold T. The person who differs has 20 rows: Gaussian on one side, 1e6 e2
# on the other. Per person they move one subset (the e2 cell's count by at most 1); partitioned
# by rows they spread over about 20 subsets and lift the count far past T.

EPS, DELTA = 1.0, 1e-3
T_SUBSETS = 40


def _audit_data() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(34)
    neutral_each = rng.integers(1, 6, size=60)
    neutral = rng.standard_normal((int(neutral_each.sum()), 3))
    spikes = np.tile([0.0, 1e6, 0.0], (8, 1))
    base = np.vstack([neutral, spikes])
    units = np.concatenate(
        [np.repeat(np.arange(60), neutral_each), 60 + np.arange(8), np.full(20, 68)]
    ).astype(np.int64)
    quiet = np.vstack([base, rng.standard_normal((20, 3))])
    loud = np.vstack([base, np.tile([0.0, 1e6, 0.0], (20, 1))])
    return quiet, loud, units


QUIET, LOUD, UNITS = _audit_data()


def histogram_run(data: np.ndarray, rng: np.random.Generator, units: Any) -> Any:
    mechanism = HistogramAggregate()
    ctx = PublicContext(n_rows=data.shape[0], n_cols=3, row_norm_bound=None)
    params = mechanism.prepare(
        ctx, 1, EPS, DELTA, HistogramAggregateParams(t=T_SUBSETS, cell_width=0.5)
    )
    return mechanism.run(data, ReleaseSpec(1, EPS, DELTA, params), rng, units=units).basis


def near_e2(basis: Any) -> bool:
    return basis is not None and bool(basis[1, 0] ** 2 > 0.5)


def test_histogram_person_level_audit_stays_under_epsilon(runs: int = 1000) -> None:
    def per_person(data: np.ndarray, rng: np.random.Generator) -> Any:
        return histogram_run(data, rng, UNITS)

    result = audit(per_person, QUIET, LOUD, near_e2, runs, DELTA, seed=21)
    assert result.eps_lower_bound <= EPS, result


def test_histogram_row_partitioned_control_is_caught(runs: int = 1000) -> None:
    # The same mechanism, the same noise, partitioning rows: the person's 20 rows reach about
    # 20 subsets, and the e2 cell's count moves by about 20 instead of 1.
    def per_row(data: np.ndarray, rng: np.random.Generator) -> Any:
        return histogram_run(data, rng, None)

    result = audit(per_row, QUIET, LOUD, near_e2, runs, DELTA, seed=22)
    assert result.eps_lower_bound > EPS, result


@pytest.mark.slow
def test_histogram_person_level_audit_long() -> None:
    test_histogram_person_level_audit_stays_under_epsilon(runs=20_000)


def test_friendly_aggregate_runs_on_a_partition_of_people() -> None:
    """A person-level friendly release on data near a line: every person's rows in one subset,
    and the released direction still finds the line."""
    rng = np.random.default_rng(5)
    each = rng.integers(1, 21, size=400)
    units = np.repeat(np.arange(400), each).astype(np.int64)
    n = units.size
    line = np.array([0.6, 0.8, 0.0, 0.0])
    data = rng.standard_normal((n, 1)) * line + 0.01 * rng.standard_normal((n, 4))
    mechanism = FriendlyAggregate()
    ctx = PublicContext(n_rows=n, n_cols=4, row_norm_bound=None)
    params = mechanism.prepare(ctx, 1, 4.0, 1e-5, FriendlyAggregateParams(t=200))
    output = mechanism.run(data, ReleaseSpec(1, 4.0, 1e-5, params), rng, units=units)
    assert output.basis is not None, output.no_result_reason
    assert abs(float(output.basis[:, 0] @ line)) > 0.99
