"""The worker's outage log (:class:`service.outages.OutageLog`): one line when an outage
starts, one when it ends, however its threads interleave."""

from __future__ import annotations

import logging

import pytest

from service.outages import OutageLog

DOWN = "database unavailable"
BACK = "database available again"


def lines(caplog: pytest.LogCaptureFixture, text: str) -> int:
    return sum(text in record.getMessage() for record in caplog.records)


@pytest.fixture
def outages(caplog: pytest.LogCaptureFixture) -> OutageLog:
    caplog.set_level(logging.INFO, logger="dpss.worker")
    return OutageLog()


def test_another_operations_success_does_not_end_a_lock_wait(
    outages: OutageLog, caplog: pytest.LogCaptureFixture
) -> None:
    """A finish that keeps meeting a locked row while the re-check thread reads without
    trouble: one outage, ended by the finish's success."""
    error = TimeoutError("lock")
    outages.failed("finish", error)
    outages.succeeded("re-check")
    outages.failed("finish", error)
    outages.succeeded("re-check")
    assert (lines(caplog, DOWN), lines(caplog, BACK)) == (1, 0)
    outages.succeeded("finish")
    assert (lines(caplog, DOWN), lines(caplog, BACK)) == (1, 1)
    assert "(2 failed attempts: finish 2)" in caplog.records[-1].getMessage()


def test_any_operation_that_met_the_outage_ends_it(
    outages: OutageLog, caplog: pytest.LogCaptureFixture
) -> None:
    """A whole database away: the first operation back ends the outage, as before."""
    outages.failed("claim", ConnectionError())
    outages.failed("re-check", ConnectionError())
    outages.succeeded("claim")
    outages.succeeded("re-check")
    assert (lines(caplog, DOWN), lines(caplog, BACK)) == (1, 1)


def test_an_operation_that_gave_up_does_not_hold_the_outage_open(
    outages: OutageLog, caplog: pytest.LogCaptureFixture
) -> None:
    """A heartbeat whose job ended while it failed stops retrying; the finish's success then
    ends the outage (the heartbeat would otherwise keep it open for ever)."""
    outages.failed("heartbeat", ConnectionError())
    outages.gave_up("heartbeat")
    outages.succeeded("finish")
    assert (lines(caplog, DOWN), lines(caplog, BACK)) == (1, 1)
    outages.failed("claim", ConnectionError())
    assert lines(caplog, DOWN) == 2
