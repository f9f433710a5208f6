"""Issue 31, item 5: the accounting the upload's answer and the dry run recommend for a plan
(``service.advice``), from what each mechanism declares it admits."""

from __future__ import annotations

from decimal import Decimal

import pytest

from service import advice
from service.mechanisms.registry import MECHANISMS


def test_each_mechanism_kind_follows_its_declared_accountings():
    for name, mechanism in MECHANISMS.items():
        kind = advice.kind_of(name)
        if "zcdp" not in mechanism.accountings:
            assert kind == "unprofiled"
        elif name == "auto":
            # under gaussian, auto can only become analyze_gauss: not a Gaussian plan
            assert kind == "mixed"
        else:
            assert (kind == "gaussian") == ("gaussian" in mechanism.accountings), name


def test_gaussian_plans_get_gaussian_and_mixed_plans_zcdp():
    gaussian = [n for n in MECHANISMS if advice.kind_of(n) == "gaussian"]
    mixed = [n for n in MECHANISMS if advice.kind_of(n) == "mixed"]
    assert "analyze_gauss" in gaussian and "friendly_aggregate" in mixed and "auto" in mixed
    assert advice.recommend(gaussian).accounting == "gaussian"
    assert advice.recommend(["analyze_gauss", "friendly_aggregate"]).accounting == "zcdp"
    assert advice.recommend(["auto"]).accounting == "zcdp"
    # no plan named: the accounting that admits every profiled mechanism, and how to do better
    nothing = advice.recommend([])
    # issue 31, item 5: with no plan the general recommendation is the default, hybrid
    assert nothing.accounting == "hybrid" and "planned_mechanisms" in nothing.reason


def test_an_unprofiled_mechanism_in_the_plan_needs_basic():
    unprofiled = [n for n in MECHANISMS if advice.kind_of(n) == "unprofiled"]
    for name in unprofiled:
        shown = advice.recommend(["analyze_gauss", name])
        assert shown.accounting == "basic" and name in shown.reason


def test_few_releases_of_pure_steps_get_basic_many_get_zcdp():
    assert advice.advise(["exact_gapmax"], "mixed", 1).accounting == "basic"
    assert advice.advise(["exact_gapmax"], "mixed", advice.FEW_RELEASES).accounting == "basic"
    assert advice.advise(["exact_gapmax"], "mixed", advice.FEW_RELEASES + 1).accounting == "zcdp"
    # a Gaussian release gets gaussian at any count (it equals basic at one release)
    assert advice.advise(["analyze_gauss"], "gaussian", 1).accounting == "gaussian"


def test_releases_of_a_request():
    assert advice.releases_of(Decimal(1), Decimal("0.5")) == 2
    assert advice.releases_of(Decimal(1), Decimal("0.3")) == 3
    assert advice.releases_of(Decimal(1), Decimal(0)) is None
    # A quotient past 28 digits (the default context's precision) is still a count.
    assert advice.releases_of(Decimal(1000), Decimal("1e-26")) == 10**29
    assert advice.releases_of(Decimal(10**6), Decimal("1e-30")) == 10**36


def test_planned_mechanisms_parse_and_name_the_unknown_one():
    assert advice.parse_planned(None) == []
    assert advice.parse_planned(" analyze_gauss, spectrum ,") == ["analyze_gauss", "spectrum"]
    with pytest.raises(ValueError, match="'pca'"):
        advice.parse_planned("analyze_gauss,pca")
