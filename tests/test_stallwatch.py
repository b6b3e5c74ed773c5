"""The stall watchdog on a real event loop that a callback really blocks."""

from __future__ import annotations

import asyncio
import logging
import time

import pytest
from prometheus_client import CollectorRegistry, Histogram

from edge_app.stallwatch import StallWatch


def _histogram() -> tuple[Histogram, CollectorRegistry]:
    reg = CollectorRegistry()
    return Histogram("lag_seconds", "lag", buckets=(0.01, 0.1, 0.25, 1.0), registry=reg), reg


def blocking_callback_for_test() -> None:
    time.sleep(0.5)  # holds the loop thread, as a slow synchronous call in a coroutine would


async def test_a_blocked_loop_is_reported_with_its_stack(caplog: pytest.LogCaptureFixture) -> None:
    hist, reg = _histogram()
    watch = StallWatch(hist, interval_s=0.02, warn_s=0.2)
    watch.start()
    with caplog.at_level(logging.WARNING, logger="edge_app.stallwatch"):
        await asyncio.sleep(0.1)
        blocking_callback_for_test()
        await asyncio.sleep(0.1)
    await watch.stop()
    texts = [r.getMessage() for r in caplog.records]
    during = [t for t in texts if "has not turned" in t]
    assert len(during) == 1, texts  # reported once while it lasted, with the culprit's frame
    assert "blocking_callback_for_test" in during[0]
    after = [t for t in texts if "stalled for" in t]
    assert len(after) == 1, texts
    assert watch.stalls == 1 and 0.45 < watch.longest_s < 1.5
    assert reg.get_sample_value("lag_seconds_bucket", {"le": "0.25"}) < reg.get_sample_value("lag_seconds_count")


async def test_a_turning_loop_is_quiet(caplog: pytest.LogCaptureFixture) -> None:
    hist, reg = _histogram()
    watch = StallWatch(hist, interval_s=0.02, warn_s=0.2)
    watch.start()
    with caplog.at_level(logging.WARNING, logger="edge_app.stallwatch"):
        for _ in range(10):
            time.sleep(0.05)  # short blocking calls, each under warn_s
            await asyncio.sleep(0.01)
    await watch.stop()
    assert not caplog.records and watch.stalls == 0
    assert reg.get_sample_value("lag_seconds_count") >= 5


def test_bad_intervals_are_refused() -> None:
    with pytest.raises(ValueError, match="interval_s < warn_s"):
        StallWatch(_histogram()[0], interval_s=0.3, warn_s=0.2)
